/*
 * trace.h: reads an allocation trace (CSV: time, op, id, size, stream; bench/traces/README.md)
 * for the benchmarks that replay them (frag.c, replay.c).
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

#endif
