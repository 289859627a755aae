/*
 * options.h: gpupoold's command line, parsed into one struct with defaults. Kept apart from
 * main() so that every accepted and refused option has a unit test.
 */
#ifndef GP_OPTIONS_H
#define GP_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"

enum backend_choice {
        BACKEND_AUTO,
        BACKEND_HOST,
        BACKEND_CUDA,
};

enum options_action {
        OPTIONS_RUN,
        OPTIONS_HELP,
        OPTIONS_VERSION,
};

#define OPTIONS_DEFAULT_HOST_CAPACITY (1ULL << 30)
#define OPTIONS_DEFAULT_HEADROOM (512ULL << 20)
#define OPTIONS_DEFAULT_MAX_CLIENTS 1024
#define OPTIONS_DEFAULT_MAX_BLOCKS (1U << 20)

struct options {
        enum options_action action;
        const char *socket_path;        /* points into argv or at the default */
        enum backend_choice backend;
        uint64_t host_capacity_bytes;
        uint64_t headroom_bytes;        /* cuda: device memory left to others, per GPU */
        uint64_t client_limit_bytes;    /* 0: no per-client limit */
        enum log_level log_level;
        unsigned max_clients;
        unsigned max_blocks;            /* live blocks per client */
        bool check_invariants;          /* run pool_check() after every request */
};

/*
 * Parses argv. Returns 0 and fills *ret (defaults for what is not given), or -EINVAL with a
 * one-line message naming the option in err. *ret is untouched on failure.
 */
int options_parse(int argc, char **argv, struct options *ret, char *err, size_t err_size);

/* The --help text. */
extern const char options_usage[];

#endif
