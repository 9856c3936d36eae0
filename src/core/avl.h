/*
 * avl.h - an intrusive AVL tree. Not installed.
 *
 * Nodes are embedded in the caller's structs; the tree never allocates, so
 * it can index memory the allocator itself manages. Ordering comes from a
 * comparator over two nodes (for insert) and over a key and a node (for
 * searches). Every operation is O(log n); heights are kept exact, so the
 * tree stays within 1.44 log2(n) deep.
 */
#ifndef LLMEM_AVL_H
#define LLMEM_AVL_H

#include <stddef.h>

typedef struct llmem__avl_node {
    struct llmem__avl_node *left, *right, *parent;
    int height; /* leaf = 1 */
} llmem__avl_node;

typedef struct llmem_avl {
    llmem__avl_node *root;
    size_t count;
} llmem_avl;

/* <0, 0, >0 as a orders before, with, after b. */
typedef int (*llmem__avl_cmp)(const llmem__avl_node *a, const llmem__avl_node *b);
/* <0, 0, >0 as key orders before, with, after n. */
typedef int (*llmem__avl_key_cmp)(const void *key, const llmem__avl_node *n);

void llmem__avl_insert(llmem_avl *t, llmem__avl_node *n, llmem__avl_cmp cmp);
void llmem__avl_remove(llmem_avl *t, llmem__avl_node *n);

/* The first node not ordered before key (C++'s lower_bound), or NULL. */
llmem__avl_node *llmem__avl_lower_bound(const llmem_avl *t, const void *key, llmem__avl_key_cmp cmp);

llmem__avl_node *llmem__avl_first(const llmem_avl *t);
llmem__avl_node *llmem__avl_last(const llmem_avl *t);
llmem__avl_node *llmem__avl_next(const llmem__avl_node *n);
llmem__avl_node *llmem__avl_prev(const llmem__avl_node *n);

/* Check heights, balance, parent links and order; returns the node count
 * or -1 if anything is wrong (for tests and pool checks). */
long llmem__avl_check(const llmem_avl *t, llmem__avl_cmp cmp);

#endif
