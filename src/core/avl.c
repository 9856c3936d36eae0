/*
 * avl.c - intrusive AVL tree with parent links.
 *
 * Insert descends to a leaf position and walks back up fixing heights and
 * rotating where a subtree's children differ by two. Remove swaps a node
 * with two children for its in-order successor (relinking nodes, never
 * copying them, since they are embedded in caller structs), unlinks it, and
 * rebalances from the lowest changed ancestor up, stopping where a
 * subtree's height is unchanged.
 */
#include "avl.h"

#include <stdbool.h>

static inline int h(const llmem__avl_node *n) { return n ? n->height : 0; }
static inline int max2(int a, int b) { return a > b ? a : b; }
static inline void fix_height(llmem__avl_node *n) { n->height = 1 + max2(h(n->left), h(n->right)); }

/* Point whatever pointed at old (parent's child or the root) at new. */
static void replace_child(llmem_avl *t, llmem__avl_node *parent, llmem__avl_node *old, llmem__avl_node *new_)
{
    if (!parent) t->root = new_;
    else if (parent->left == old) parent->left = new_;
    else parent->right = new_;
    if (new_) new_->parent = parent;
}

static llmem__avl_node *rotate_left(llmem_avl *t, llmem__avl_node *x)
{
    llmem__avl_node *y = x->right;
    replace_child(t, x->parent, x, y);
    x->right = y->left;
    if (y->left) y->left->parent = x;
    y->left = x;
    x->parent = y;
    fix_height(x);
    fix_height(y);
    return y;
}

static llmem__avl_node *rotate_right(llmem_avl *t, llmem__avl_node *x)
{
    llmem__avl_node *y = x->left;
    replace_child(t, x->parent, x, y);
    x->left = y->right;
    if (y->right) y->right->parent = x;
    y->right = x;
    x->parent = y;
    fix_height(x);
    fix_height(y);
    return y;
}

/* Restore balance from n up towards the root. It stops at the first
 * subtree whose height came out as it was before: nothing above it can
 * have changed (insert and remove alter one subtree's height at a time). */
static void rebalance(llmem_avl *t, llmem__avl_node *n)
{
    while (n) {
        int before = n->height;
        fix_height(n);
        int bal = h(n->left) - h(n->right);
        if (bal > 1) {
            if (h(n->left->left) < h(n->left->right)) rotate_left(t, n->left);
            n = rotate_right(t, n);
        } else if (bal < -1) {
            if (h(n->right->right) < h(n->right->left)) rotate_right(t, n->right);
            n = rotate_left(t, n);
        }
        if (n->height == before) return;
        n = n->parent;
    }
}

void llmem__avl_insert(llmem_avl *t, llmem__avl_node *n, llmem__avl_cmp cmp)
{
    n->left = n->right = NULL;
    n->height = 1;
    llmem__avl_node *parent = NULL, **link = &t->root;
    while (*link) {
        parent = *link;
        link = cmp(n, parent) < 0 ? &parent->left : &parent->right;
    }
    n->parent = parent;
    *link = n;
    t->count++;
    rebalance(t, parent);
}

void llmem__avl_remove(llmem_avl *t, llmem__avl_node *n)
{
    llmem__avl_node *fix;
    if (n->left && n->right) {
        /* Put the successor s (leftmost of the right subtree, no left
         * child) in n's place, then n is gone from the shape. */
        llmem__avl_node *s = n->right;
        while (s->left) s = s->left;
        llmem__avl_node *s_parent = s->parent, *s_right = s->right;
        if (s_parent != n) {
            s_parent->left = s_right;
            if (s_right) s_right->parent = s_parent;
            s->right = n->right;
            n->right->parent = s;
            fix = s_parent;
        } else {
            fix = s;
        }
        s->left = n->left;
        n->left->parent = s;
        replace_child(t, n->parent, n, s);
        s->height = n->height;
    } else {
        llmem__avl_node *child = n->left ? n->left : n->right;
        fix = n->parent;
        replace_child(t, n->parent, n, child);
    }
    t->count--;
    n->left = n->right = n->parent = NULL;
    rebalance(t, fix);
}

llmem__avl_node *llmem__avl_lower_bound(const llmem_avl *t, const void *key, llmem__avl_key_cmp cmp)
{
    llmem__avl_node *n = t->root, *best = NULL;
    while (n) {
        if (cmp(key, n) <= 0) {
            best = n;
            n = n->left;
        } else {
            n = n->right;
        }
    }
    return best;
}

llmem__avl_node *llmem__avl_first(const llmem_avl *t)
{
    llmem__avl_node *n = t->root;
    while (n && n->left) n = n->left;
    return n;
}

llmem__avl_node *llmem__avl_last(const llmem_avl *t)
{
    llmem__avl_node *n = t->root;
    while (n && n->right) n = n->right;
    return n;
}

llmem__avl_node *llmem__avl_next(const llmem__avl_node *n)
{
    if (n->right) {
        n = n->right;
        while (n->left) n = n->left;
        return (llmem__avl_node *)n;
    }
    while (n->parent && n->parent->right == n) n = n->parent;
    return n->parent;
}

llmem__avl_node *llmem__avl_prev(const llmem__avl_node *n)
{
    if (n->left) {
        n = n->left;
        while (n->right) n = n->right;
        return (llmem__avl_node *)n;
    }
    while (n->parent && n->parent->left == n) n = n->parent;
    return n->parent;
}

static long check(const llmem__avl_node *n, const llmem__avl_node *parent, llmem__avl_cmp cmp, int *height)
{
    if (!n) {
        *height = 0;
        return 0;
    }
    if (n->parent != parent) return -1;
    if (n->left && cmp(n->left, n) > 0) return -1;
    if (n->right && cmp(n->right, n) < 0) return -1;
    int hl, hr;
    long cl = check(n->left, n, cmp, &hl), cr = check(n->right, n, cmp, &hr);
    if (cl < 0 || cr < 0) return -1;
    if (hl - hr > 1 || hr - hl > 1 || n->height != 1 + max2(hl, hr)) return -1;
    *height = n->height;
    return cl + cr + 1;
}

long llmem__avl_check(const llmem_avl *t, llmem__avl_cmp cmp)
{
    int height;
    long n = check(t->root, NULL, cmp, &height);
    if (n < 0 || (size_t)n != t->count) return -1;
    /* In-order walk must be sorted (catches cross-subtree disorder). */
    const llmem__avl_node *prev = NULL;
    for (const llmem__avl_node *c = llmem__avl_first(t); c; c = llmem__avl_next(c)) {
        if (prev && cmp(prev, c) > 0) return -1;
        prev = c;
    }
    return n;
}
