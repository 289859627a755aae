/*
 * check_gpu_main.c: "make check-gpu", the cuda backend's tests on the real driver of a GPU
 * machine (tests/integration/check_cuda.c and check_cuda_vmm.c). Without a driver or a GPU
 * it says so and skips.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"
#include "suites.h"
#include "testlib.h"

/* Whether a driver with a GPU loads, asked in a child: this process must not touch CUDA before it forks. */
static int gpu_present(char *why, size_t size) {
        int fds[2], status;
        pid_t pid;
        ssize_t n;

        if (pipe(fds) < 0)
                return 0;
        pid = fork();
        if (pid == 0) {
                struct gp_cuda cu;
                char err[256];
                int r = gp_cuda_load(&cu, err, sizeof(err));

                if (r < 0 && write(fds[1], err, sizeof(err)) < 0)
                        _exit(2);
                _exit(r < 0);
        }
        close(fds[1]);
        n = read(fds[0], why, size - 1);
        why[n > 0 ? n : 0] = '\0';
        close(fds[0]);
        waitpid(pid, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void) {
        char why[256];
        SRunner *sr;
        int failed;

        if (getenv("GPUPOOL_LIBCUDA"))
                fprintf(stderr, "check-gpu: using the driver in $GPUPOOL_LIBCUDA=%s\n", getenv("GPUPOOL_LIBCUDA"));
        if (!gpu_present(why, sizeof(why))) {
                printf("check-gpu: SKIPPED, no GPU to test on: %s\n", why);
                return 0;
        }
        sr = srunner_create(suite_cuda_gpu());
        skips_begin();
        srunner_run_all(sr, CK_VERBOSE);
        (void) skips_report();
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
