/*
 * trace.h: reads an allocation trace (CSV: time, op, id, size, stream; bench/traces/README.md)
 * for the benchmarks that replay them (frag.c, replay.c, lag.c).
 */
#ifndef GP_BENCH_TRACE_H
#define GP_BENCH_TRACE_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct op {
        bool alloc;
        uint64_t id, size;
};

struct trace {
        struct op *ops;
        size_t n;
        uint64_t max_id;        /* ids run from 1 to this */
};

/*
 * Reads path into *t (free t->ops). Lines that are not five fields (the header) are skipped;
 * an op other than a or f, an allocation of 0 bytes or an id of 0 or over 2^32 is refused,
 * saying which line. Returns 0, -errno when the file cannot be read, or -EINVAL.
 */
static int trace_read(const char *path, struct trace *t) {
        FILE *f;
        char line[256];
        size_t cap = 0;

        *t = (struct trace) { 0 };
        f = fopen(path, "r");
        if (!f)
                return -errno;
        while (fgets(line, sizeof(line), f)) {
                unsigned long long time, id, size, stream;
                char op;

                if (sscanf(line, "%llu,%c,%llu,%llu,%llu", &time, &op, &id, &size, &stream) != 5)
                        continue;       /* the header */
                if ((op != 'a' && op != 'f') || (op == 'a' && size == 0) || id == 0 || id > (1ULL << 32)) {
                        fprintf(stderr, "%s: bad line: %s", path, line);
                        fclose(f);
                        free(t->ops);
                        t->ops = NULL;
                        return -EINVAL;
                }
                if (t->n == cap) {
                        cap = cap ? cap * 2 : 4096;
                        t->ops = realloc(t->ops, cap * sizeof(*t->ops));
                        if (!t->ops)
                                abort();
                }
                t->ops[t->n++] = (struct op) { op == 'a', id, size };
                if (id > t->max_id)
                        t->max_id = id;
        }
        fclose(f);
        return 0;
}

/*
 * What a replay through libgpupool has live of a trace (replay.c, lag.c): each id's pointer and
 * size (rounded to 512 B, as the pool rounds), the bytes in use and their peak.
 */
struct trace_live {
        void **ptrs;
        uint64_t *sizes;
        uint64_t in_use, peak;
};

static inline void trace_live_init(struct trace_live *l, const struct trace *t) {
        l->ptrs = calloc(t->max_id + 1, sizeof(*l->ptrs));
        l->sizes = calloc(t->max_id + 1, sizeof(*l->sizes));
        if (!l->ptrs || !l->sizes)
                abort();
        l->in_use = l->peak = 0;
}

static inline void trace_live_free(struct trace_live *l) {
        free(l->ptrs);
        free(l->sizes);
}

/*
 * Whether to replay o: 1 yes; 0 no (a free of an id allocated before the recording began); or
 * -EINVAL, saying so as who, for an allocation of an id that is live.
 */
static inline int trace_live_check(const struct trace_live *l, const struct op *o, const char *who) {
        if (o->alloc && l->ptrs[o->id]) {
                fprintf(stderr, "%s: allocation %llu made twice\n", who, (unsigned long long) o->id);
                return -EINVAL;
        }
        return o->alloc || l->ptrs[o->id];
}

/* Records o as replayed: ptr is what an allocation made (a free's is unused). */
static inline void trace_live_done(struct trace_live *l, const struct op *o, void *ptr) {
        if (o->alloc) {
                l->ptrs[o->id] = ptr;
                l->sizes[o->id] = (o->size + 511) & ~511ULL;
                l->in_use += l->sizes[o->id];
                if (l->in_use > l->peak)
                        l->peak = l->in_use;
        } else {
                l->ptrs[o->id] = NULL;
                l->in_use -= l->sizes[o->id];
        }
}

#endif
