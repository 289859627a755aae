/* check_rbtree.c: the red-black tree against a brute-force model, under random churn. */
#include <stdlib.h>

#include "rbtree.h"
#include "suites.h"

struct item {
        int key;
        bool in;
        struct gp_rb_node node;
};

static int cmp_item(const struct gp_rb_node *a, const struct gp_rb_node *b) {
        int x = gp_rb_entry(a, struct item, node)->key, y = gp_rb_entry(b, struct item, node)->key;

        return x < y ? -1 : x > y;
}

#define N 2000

START_TEST(test_random_churn) {
        static struct item items[N];
        struct gp_rb_tree t;
        unsigned seed = 12345;
        size_t in = 0;

        gp_rb_init(&t, cmp_item);
        for (int i = 0; i < N; i++)
                items[i] = (struct item) { .key = i * 2 };
        for (int step = 0; step < 40000; step++) {
                struct item *it = &items[rand_r(&seed) % N];

                if (it->in) {
                        gp_rb_remove(&t, &it->node);
                        it->in = false;
                        in--;
                } else {
                        ck_assert_ptr_null(gp_rb_insert(&t, &it->node));
                        it->in = true;
                        in++;
                }
                if (step % 500 == 0) {
                        ck_assert_int_eq(gp_rb_verify(&t), 0);
                        ck_assert_uint_eq(t.count, in);
                }
                if (step % 97 == 0) {
                        /* lower_bound and floor against a linear answer, for odd (absent) keys. */
                        struct item key = { .key = (int) (rand_r(&seed) % (2 * N + 2)) - 1 };
                        struct gp_rb_node *lb = gp_rb_lower_bound(&t, &key.node), *fl = gp_rb_floor(&t, &key.node);
                        int want_lb = -1, want_fl = -1;

                        for (int i = 0; i < N; i++) {
                                if (!items[i].in)
                                        continue;
                                if (items[i].key >= key.key && want_lb < 0)
                                        want_lb = items[i].key;
                                if (items[i].key <= key.key)
                                        want_fl = items[i].key;
                        }
                        ck_assert_int_eq(lb ? gp_rb_entry(lb, struct item, node)->key : -1, want_lb);
                        ck_assert_int_eq(fl ? gp_rb_entry(fl, struct item, node)->key : -1, want_fl);
                }
        }
        /* In-order walk is sorted and complete. */
        {
                int prev = -1;
                size_t count = 0;

                for (struct gp_rb_node *n = gp_rb_first(&t); n; n = gp_rb_next(n)) {
                        int k = gp_rb_entry(n, struct item, node)->key;

                        ck_assert_int_gt(k, prev);
                        prev = k;
                        count++;
                }
                ck_assert_uint_eq(count, in);
        }
}
END_TEST

START_TEST(test_duplicate_insert) {
        struct item a = { .key = 7 }, b = { .key = 7 };
        struct gp_rb_tree t;

        gp_rb_init(&t, cmp_item);
        ck_assert_ptr_null(gp_rb_insert(&t, &a.node));
        ck_assert_ptr_eq(gp_rb_insert(&t, &b.node), &a.node);
        ck_assert_uint_eq(t.count, 1);
        ck_assert_ptr_eq(gp_rb_find(&t, &b.node), &a.node);
}
END_TEST

Suite *suite_rbtree(void) {
        Suite *s = suite_create("rbtree");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_random_churn);
        tcase_add_test(tc, test_duplicate_insert);
        suite_add_tcase(s, tc);
        return s;
}
