/*
 * rbtree.h: an intrusive red-black tree.
 *
 * The pool's free-block index, the segment tables and the client's mapping table all need an
 * ordered map with O(log n) insert, delete and lower-bound search. The node lives inside the
 * caller's struct (no allocation here), and the order is a comparison function given to the
 * tree, so one implementation serves every index.
 */
#ifndef GP_RBTREE_H
#define GP_RBTREE_H

#include <stdbool.h>
#include <stddef.h>

struct gp_rb_node {
        struct gp_rb_node *parent;
        struct gp_rb_node *left;
        struct gp_rb_node *right;
        bool red;
};

/* Orders two nodes, or a key against a node (see gp_rb_lower_bound): <0, 0 or >0. */
typedef int (*gp_rb_cmp_fn)(const struct gp_rb_node *a, const struct gp_rb_node *b);

struct gp_rb_tree {
        struct gp_rb_node *root;
        gp_rb_cmp_fn cmp;
        size_t count;
};

#define gp_rb_entry(node, type, member) \
        ((type *) ((char *) (node) - offsetof(type, member)))

void gp_rb_init(struct gp_rb_tree *tree, gp_rb_cmp_fn cmp);

/* Inserts node. Returns the node already equal to it (and inserts nothing), or NULL. */
struct gp_rb_node *gp_rb_insert(struct gp_rb_tree *tree, struct gp_rb_node *node);

/* Removes a node that is in the tree. */
void gp_rb_remove(struct gp_rb_tree *tree, struct gp_rb_node *node);

/* The node equal to key, or NULL. key is a node (often on the stack) holding the sort key. */
struct gp_rb_node *gp_rb_find(const struct gp_rb_tree *tree, const struct gp_rb_node *key);

/* The smallest node not less than key, or NULL: best fit when the order is by size. */
struct gp_rb_node *gp_rb_lower_bound(const struct gp_rb_tree *tree, const struct gp_rb_node *key);

/* The greatest node not greater than key, or NULL: "which mapping holds this address". */
struct gp_rb_node *gp_rb_floor(const struct gp_rb_tree *tree, const struct gp_rb_node *key);

struct gp_rb_node *gp_rb_first(const struct gp_rb_tree *tree);
struct gp_rb_node *gp_rb_next(const struct gp_rb_node *node);

/* Checks colours, black heights, order and parent links; returns 0 or -EUCLEAN. For tests. */
int gp_rb_verify(const struct gp_rb_tree *tree);

#endif
