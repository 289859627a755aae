/*
 * gpupool_run.c: gpupool-run [--socket PATH] [--name NAME] [--without-daemon driver|refuse]
 * -- CMD [ARGS...]: runs CMD, a program that knows nothing of gpupool, with libgpupool-run.so
 * preloaded (run/preload.c), so that its CUDA device memory comes from gpupoold's pool under
 * the client's limits. Its children inherit the preload (and connect on their own).
 *
 * The library is $GPUPOOL_RUN_LIBRARY, else libgpupool-run.so beside this program (a build
 * tree), else the one the dynamic linker finds, as it finds libgpupool.so.1 (installed). The settings go to CMD as the
 * environment the library reads: $GPUPOOL_SOCKET, $GPUPOOL_CLIENT_NAME (default: CMD's name,
 * as the library names a client) and $GPUPOOL_RUN_WITHOUT_DAEMON. Exits as CMD does; 127 when
 * CMD cannot be found, 126 when it cannot be run, 2 for bad arguments, as env(1) does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIBRARY "libgpupool-run.so"

static void usage(FILE *f) {
        fprintf(f, "usage: gpupool-run [--socket PATH] [--name NAME] [--without-daemon driver|refuse] -- CMD [ARGS...]\n"
                   "runs CMD with its CUDA device memory taken from gpupoold (man gpupool-run)\n");
}

/* The preloaded library's path in buf: the environment's, beside this program, or the installed one. */
static int find_library(char *buf, size_t size) {
        const char *env = getenv("GPUPOOL_RUN_LIBRARY");
        char self[PATH_MAX];
        struct link_map *map;
        ssize_t n;
        char *slash;
        void *h;

        if (env && *env) {
                snprintf(buf, size, "%s", env);
                return access(buf, R_OK) == 0 ? 0 : -errno;
        }
        n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n > 0) {
                self[n] = '\0';
                if ((slash = strrchr(self, '/'))) {
                        *slash = '\0';
                        if (snprintf(buf, size, "%s/%s", self, LIBRARY) < (int) size && access(buf, R_OK) == 0)
                                return 0;
                }
        }
        /* Where the dynamic linker finds it: its full path, for the program's linker to preload. */
        snprintf(buf, size, "%s", LIBRARY);
        h = dlopen(LIBRARY, RTLD_LAZY);
        if (!h)
                return -ENOENT;
        if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map->l_name[0] == '/')
                snprintf(buf, size, "%s", map->l_name);
        return 0;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "socket", required_argument, NULL, 's' }, { "name", required_argument, NULL, 'n' },
                { "without-daemon", required_argument, NULL, 'w' }, { "help", no_argument, NULL, 'h' },
                { NULL, 0, NULL, 0 },
        };
        char lib[PATH_MAX], *preload;
        const char *old, *name = NULL;
        int o, r;

        while ((o = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
                switch (o) {
                case 's':
                        if (!*optarg) {
                                fprintf(stderr, "gpupool-run: --socket: an empty path\n");
                                return 2;
                        }
                        setenv("GPUPOOL_SOCKET", optarg, 1);
                        break;
                case 'n':
                        name = optarg;
                        break;
                case 'w':
                        if (strcmp(optarg, "driver") != 0 && strcmp(optarg, "refuse") != 0) {
                                fprintf(stderr, "gpupool-run: --without-daemon %s: \"driver\" (allocate from the CUDA driver, "
                                                "saying so) or \"refuse\" (every allocation out of memory)\n", optarg);
                                return 2;
                        }
                        setenv("GPUPOOL_RUN_WITHOUT_DAEMON", optarg, 1);
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        if (optind >= argc) {
                fprintf(stderr, "gpupool-run: no command to run\n");
                usage(stderr);
                return 2;
        }
        if (name) {
                if (!*name || strlen(name) > 63) {
                        fprintf(stderr, "gpupool-run: --name %s: a client name is 1 to 63 bytes\n", name);
                        return 2;
                }
                setenv("GPUPOOL_CLIENT_NAME", name, 1);
        }
        r = find_library(lib, sizeof(lib));
        if (r < 0) {
                fprintf(stderr, "gpupool-run: cannot find %s: %s (set $GPUPOOL_RUN_LIBRARY to its path)\n", lib, strerror(-r));
                return 127;
        }
        /* First in the list: the program's driver calls find its entry points before any other's. */
        old = getenv("LD_PRELOAD");
        if (asprintf(&preload, "%s%s%s", lib, old && *old ? " " : "", old && *old ? old : "") < 0) {
                fprintf(stderr, "gpupool-run: out of memory\n");
                return 1;
        }
        setenv("LD_PRELOAD", preload, 1);
        free(preload);
        execvp(argv[optind], argv + optind);
        r = errno;
        fprintf(stderr, "gpupool-run: %s: %s\n", argv[optind], strerror(r));
        return r == ENOENT ? 127 : 126;
}
