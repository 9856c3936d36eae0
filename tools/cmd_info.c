/*
 * cmd_info.c - `llmem info`: what this machine offers llmem.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "llmem/llmem.h"

int llmem_cmd_info(int argc, char **argv)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: llmem info [--json]\n\nPage sizes, huge pages, NUMA and the resources this build offers.\n");
            return 0;
        } else {
            fprintf(stderr, "llmem info: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    llmem_os_caps c;
    llmem_status st = llmem_os_get_caps(&c);
    if (st) {
        fprintf(stderr, "llmem info: %s\n", llmem_error_message());
        return 1;
    }
    const char *resources = "os, sim-device, limit, fault, tracking";
    if (json) {
        printf("{\"version\":\"%s\",\"page_size\":%zu,\"huge_page_size\":%zu,\"hugetlb_free\":%llu,"
               "\"thp_available\":%s,\"numa_available\":%s,\"numa_nodes\":%d,\"resources\":\"%s\"}\n",
               llmem_version(), c.page_size, c.huge_page_size, (unsigned long long)c.hugetlb_free,
               c.thp_available ? "true" : "false", c.numa_available ? "true" : "false", c.numa_nodes, resources);
        return 0;
    }
    printf("llmem %s\n", llmem_version());
    printf("  page size            %zu bytes\n", c.page_size);
    printf("  huge page size       %zu KiB\n", c.huge_page_size / 1024);
    printf("  hugetlb pages free   %llu%s\n", (unsigned long long)c.hugetlb_free,
           c.hugetlb_free ? "" : " (explicit huge pages fall back to THP)");
    printf("  transparent huge     %s\n", c.thp_available ? "available" : "disabled");
    printf("  NUMA                 %s, %d node(s)\n", c.numa_available ? "libnuma loaded" : "not available",
           c.numa_nodes);
    printf("  resources            %s\n", resources);
    printf("  pools                arena, fixed, pool (dynamic)\n");
    return 0;
}
