/*
 * llmem/version.h - library version and the export macro.
 *
 * CMakeLists.txt reads the version from this file, so it is the one place to
 * change it. llmem_version() reports the version the library was built as,
 * which may differ from these macros when an application was compiled
 * against other headers.
 */
#ifndef LLMEM_VERSION_H
#define LLMEM_VERSION_H

#define LLMEM_VERSION_MAJOR 0
#define LLMEM_VERSION_MINOR 1
#define LLMEM_VERSION_PATCH 0
#define LLMEM_VERSION_STRING "0.1.0"

/* Public functions are the only symbols the shared library exports; the
 * library is compiled with -fvisibility=hidden. */
#if defined(LLMEM_BUILDING) && defined(__GNUC__)
#define LLMEM_API __attribute__((visibility("default")))
#else
#define LLMEM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* "MAJOR.MINOR.PATCH" of the library actually linked. */
LLMEM_API const char *llmem_version(void);

/* A one-line description of how the library was built (compiler, build
 * type, sanitizers, optional features such as NUMA and CUDA). */
LLMEM_API const char *llmem_build_info(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_VERSION_H */
