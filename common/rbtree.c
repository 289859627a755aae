/*
 * rbtree.c: an intrusive red-black tree (CLRS, with parent pointers and NULL leaves).
 *
 * Written here rather than taken from a library because the pool needs lower-bound search on
 * an intrusive node, and the small implementations that offer it are macro headers that libuv
 * stopped installing. Every path is exercised by tests/unit/check_rbtree.c against
 * gp_rb_verify().
 */
#include "rbtree.h"

#include <errno.h>

void gp_rb_init(struct gp_rb_tree *tree, gp_rb_cmp_fn cmp) {
        tree->root = NULL;
        tree->cmp = cmp;
        tree->count = 0;
}

static void rotate_left(struct gp_rb_tree *tree, struct gp_rb_node *x) {
        struct gp_rb_node *y = x->right;

        x->right = y->left;
        if (y->left)
                y->left->parent = x;
        y->parent = x->parent;
        if (!x->parent)
                tree->root = y;
        else if (x == x->parent->left)
                x->parent->left = y;
        else
                x->parent->right = y;
        y->left = x;
        x->parent = y;
}

static void rotate_right(struct gp_rb_tree *tree, struct gp_rb_node *x) {
        struct gp_rb_node *y = x->left;

        x->left = y->right;
        if (y->right)
                y->right->parent = x;
        y->parent = x->parent;
        if (!x->parent)
                tree->root = y;
        else if (x == x->parent->right)
                x->parent->right = y;
        else
                x->parent->left = y;
        y->right = x;
        x->parent = y;
}

struct gp_rb_node *gp_rb_insert(struct gp_rb_tree *tree, struct gp_rb_node *node) {
        struct gp_rb_node *parent = NULL, **link = &tree->root;

        while (*link) {
                int c = tree->cmp(node, *link);

                parent = *link;
                if (c == 0)
                        return parent;
                link = c < 0 ? &parent->left : &parent->right;
        }
        node->parent = parent;
        node->left = node->right = NULL;
        node->red = true;
        *link = node;
        tree->count++;

        /* Restore the red rule: walk up while the parent is red. */
        while (node->parent && node->parent->red) {
                struct gp_rb_node *p = node->parent, *g = p->parent;

                if (p == g->left) {
                        struct gp_rb_node *u = g->right;

                        if (u && u->red) {
                                p->red = u->red = false;
                                g->red = true;
                                node = g;
                                continue;
                        }
                        if (node == p->right) {
                                rotate_left(tree, p);
                                node = p;
                                p = node->parent;
                        }
                        p->red = false;
                        g->red = true;
                        rotate_right(tree, g);
                } else {
                        struct gp_rb_node *u = g->left;

                        if (u && u->red) {
                                p->red = u->red = false;
                                g->red = true;
                                node = g;
                                continue;
                        }
                        if (node == p->left) {
                                rotate_right(tree, p);
                                node = p;
                                p = node->parent;
                        }
                        p->red = false;
                        g->red = true;
                        rotate_left(tree, g);
                }
        }
        tree->root->red = false;
        return NULL;
}

static struct gp_rb_node *leftmost(struct gp_rb_node *n) {
        while (n && n->left)
                n = n->left;
        return n;
}

/* Puts v where u was (u's parent now points at v). */
static void transplant(struct gp_rb_tree *tree, struct gp_rb_node *u, struct gp_rb_node *v) {
        if (!u->parent)
                tree->root = v;
        else if (u == u->parent->left)
                u->parent->left = v;
        else
                u->parent->right = v;
        if (v)
                v->parent = u->parent;
}

void gp_rb_remove(struct gp_rb_tree *tree, struct gp_rb_node *z) {
        struct gp_rb_node *x, *xparent;
        bool removed_red;

        if (!z->left) {
                x = z->right;
                xparent = z->parent;
                removed_red = z->red;
                transplant(tree, z, z->right);
        } else if (!z->right) {
                x = z->left;
                xparent = z->parent;
                removed_red = z->red;
                transplant(tree, z, z->left);
        } else {
                struct gp_rb_node *y = leftmost(z->right);

                removed_red = y->red;
                x = y->right;
                if (y->parent == z) {
                        xparent = y;
                } else {
                        xparent = y->parent;
                        transplant(tree, y, y->right);
                        y->right = z->right;
                        y->right->parent = y;
                }
                transplant(tree, z, y);
                y->left = z->left;
                y->left->parent = y;
                y->red = z->red;
        }
        tree->count--;
        if (removed_red)
                return;

        /* x carries an extra black; push it up or resolve it with rotations. */
        while (x != tree->root && (!x || !x->red)) {
                if (x == xparent->left) {
                        struct gp_rb_node *w = xparent->right;

                        if (w->red) {
                                w->red = false;
                                xparent->red = true;
                                rotate_left(tree, xparent);
                                w = xparent->right;
                        }
                        if ((!w->left || !w->left->red) && (!w->right || !w->right->red)) {
                                w->red = true;
                                x = xparent;
                                xparent = x->parent;
                        } else {
                                if (!w->right || !w->right->red) {
                                        w->left->red = false;
                                        w->red = true;
                                        rotate_right(tree, w);
                                        w = xparent->right;
                                }
                                w->red = xparent->red;
                                xparent->red = false;
                                w->right->red = false;
                                rotate_left(tree, xparent);
                                x = tree->root;
                                break;
                        }
                } else {
                        struct gp_rb_node *w = xparent->left;

                        if (w->red) {
                                w->red = false;
                                xparent->red = true;
                                rotate_right(tree, xparent);
                                w = xparent->left;
                        }
                        if ((!w->left || !w->left->red) && (!w->right || !w->right->red)) {
                                w->red = true;
                                x = xparent;
                                xparent = x->parent;
                        } else {
                                if (!w->left || !w->left->red) {
                                        w->right->red = false;
                                        w->red = true;
                                        rotate_left(tree, w);
                                        w = xparent->left;
                                }
                                w->red = xparent->red;
                                xparent->red = false;
                                w->left->red = false;
                                rotate_right(tree, xparent);
                                x = tree->root;
                                break;
                        }
                }
        }
        if (x)
                x->red = false;
}

struct gp_rb_node *gp_rb_find(const struct gp_rb_tree *tree, const struct gp_rb_node *key) {
        struct gp_rb_node *n = tree->root;

        while (n) {
                int c = tree->cmp(key, n);

                if (c == 0)
                        return n;
                n = c < 0 ? n->left : n->right;
        }
        return NULL;
}

struct gp_rb_node *gp_rb_lower_bound(const struct gp_rb_tree *tree, const struct gp_rb_node *key) {
        struct gp_rb_node *n = tree->root, *best = NULL;

        while (n) {
                if (tree->cmp(key, n) <= 0) {
                        best = n;
                        n = n->left;
                } else {
                        n = n->right;
                }
        }
        return best;
}

struct gp_rb_node *gp_rb_floor(const struct gp_rb_tree *tree, const struct gp_rb_node *key) {
        struct gp_rb_node *n = tree->root, *best = NULL;

        while (n) {
                if (tree->cmp(key, n) >= 0) {
                        best = n;
                        n = n->right;
                } else {
                        n = n->left;
                }
        }
        return best;
}

struct gp_rb_node *gp_rb_first(const struct gp_rb_tree *tree) {
        return leftmost(tree->root);
}

struct gp_rb_node *gp_rb_next(const struct gp_rb_node *node) {
        if (node->right)
                return leftmost(node->right);
        while (node->parent && node == node->parent->right)
                node = node->parent;
        return node->parent;
}

/* Returns the black height of the subtree, or -1 where a rule is broken. */
static int verify_subtree(const struct gp_rb_tree *tree, const struct gp_rb_node *n, size_t *count) {
        int lh, rh;

        if (!n)
                return 1;
        (*count)++;
        if (n->red && ((n->left && n->left->red) || (n->right && n->right->red)))
                return -1;
        if ((n->left && (n->left->parent != n || tree->cmp(n->left, n) >= 0)) ||
            (n->right && (n->right->parent != n || tree->cmp(n->right, n) <= 0)))
                return -1;
        lh = verify_subtree(tree, n->left, count);
        rh = verify_subtree(tree, n->right, count);
        if (lh < 0 || rh < 0 || lh != rh)
                return -1;
        return lh + (n->red ? 0 : 1);
}

int gp_rb_verify(const struct gp_rb_tree *tree) {
        size_t count = 0;

        if (tree->root && (tree->root->red || tree->root->parent))
                return -EUCLEAN;
        if (verify_subtree(tree, tree->root, &count) < 0 || count != tree->count)
                return -EUCLEAN;
        return 0;
}
