/*
 * fuzz_users.c: libFuzzer target for what the daemon reads of who owns which uids
 * (daemon/users.c): /etc/subuid, which useradd, usermod and an administrator write (and which,
 * on a host where a tool writes it from a directory, comes from elsewhere), and a client's
 * cgroup path, whose names below a user's own slice she chooses. Checked on every input: the
 * file loads (it is always readable here) into at most USERS_MAX_RANGES ranges, kept and left
 * out lines adding up to no more than its lines; a uid's user is a function of the uid and the
 * path (the same answer twice, and the same after loading the file again); a uid that a range
 * holds is that range's owner's whatever the path says; a uid that none holds is itself below
 * USERS_SUBORDINATE_MIN whatever the path says; and (in a file of at most 64 lines) a line of a
 * numeric owner whose range no other line overlaps is a range of that owner's, first uid to last.
 *
 * Input: four bytes of a uid (little-endian), then a cgroup path up to a '\n', then the file.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "users.h"

#define MAX_PATH 512
#define CHECKED_LINES 64

/* A line's range, where its START and COUNT are numbers (whatever its owner), and its owner where that is one too. */
struct line {
        uint64_t start, count;
        bool ranged, numeric_owner, too_long;
        uint32_t owner;
};

/* All of s[0, n) a decimal number of at most 32 bits (leading zeros too), as the loader reads one. */
static bool number(const char *s, size_t n, uint64_t *ret) {
        uint64_t v = 0;

        if (!n)
                return false;
        for (size_t i = 0; i < n; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return false;
                v = v * 10 + (uint64_t) (s[i] - '0');
                if (v > UINT32_MAX)
                        return false;
        }
        *ret = v;
        return true;
}

/* Splits a line (without its newline) into l. */
static void line_parse(const char *s, size_t n, struct line *l) {
        const char *a = memchr(s, ':', n), *b = a ? memchr(a + 1, ':', n - (size_t) (a + 1 - s)) : NULL;
        uint64_t owner;
        size_t end = n;

        memset(l, 0, sizeof(*l));
        l->too_long = n >= 500;
        /* The loader reads up to the first carriage return. */
        for (size_t i = 0; i < n; i++)
                if (s[i] == '\r') {
                        end = i;
                        break;
                }
        if (!a || !b || (size_t) (b - s) >= end)
                return;
        l->ranged = number(a + 1, (size_t) (b - a - 1), &l->start) && number(b + 1, end - (size_t) (b + 1 - s), &l->count) &&
                    l->count && l->start + l->count <= (uint64_t) UINT32_MAX + 1;
        l->numeric_owner = number(s, (size_t) (a - s), &owner) && owner <= UINT32_MAX;
        l->owner = (uint32_t) owner;
}

static void check_isolated(const uint8_t *data, size_t size) {
        struct line l[CHECKED_LINES];
        size_t n = 0;

        for (size_t at = 0; at < size && n < CHECKED_LINES; n++) {
                const uint8_t *nl = memchr(data + at, '\n', size - at);
                size_t len = nl ? (size_t) (nl - (data + at)) : size - at;

                line_parse((const char *) data + at, len, &l[n]);
                at += len + 1;
        }
        if (memchr(data, '\0', size))
                return;         /* a line the loader reads up to its first zero byte: not modelled */
        for (size_t i = 0; i < n; i++) {
                bool alone = l[i].ranged && l[i].numeric_owner && !l[i].too_long;

                for (size_t j = 0; j < n && alone; j++)
                        if (j != i && l[j].ranged && l[j].start < l[i].start + l[i].count && l[i].start < l[j].start + l[j].count)
                                alone = false;
                if (alone && (users_owner((uid_t) l[i].start, NULL) != l[i].owner ||
                              users_owner((uid_t) (l[i].start + l[i].count - 1), NULL) != l[i].owner))
                        abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char cgroup[MAX_PATH], path[64];
        const uint8_t *nl;
        size_t lines = 0, len;
        unsigned skipped = 0;
        uid_t uid, owner;
        int fd, n;

        if (size < 4)
                return 0;
        uid = (uid_t) data[0] | (uid_t) data[1] << 8 | (uid_t) data[2] << 16 | (uid_t) data[3] << 24;
        data += 4, size -= 4;
        nl = memchr(data, '\n', size);
        len = nl ? (size_t) (nl - data) : size;
        if (len >= sizeof(cgroup))
                len = sizeof(cgroup) - 1;
        memcpy(cgroup, data, len);
        cgroup[len] = '\0';
        if (nl)
                size -= (size_t) (nl + 1 - data), data = nl + 1;
        else
                size = 0;
        for (size_t i = 0; i < size; i++)
                lines += data[i] == '\n';
        lines += size && data[size - 1] != '\n';
        if ((fd = memfd_create("subuid", MFD_CLOEXEC)) < 0)
                abort();
        if (size && write(fd, data, size) != (ssize_t) size)
                abort();
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n = users_load(path, &skipped);
        if (n < 0 || n > USERS_MAX_RANGES || (size_t) n + skipped > lines)
                abort();
        owner = users_owner(uid, cgroup);
        if (users_owner(uid, cgroup) != owner)
                abort();
        if (users_owner(uid, NULL) != uid) {
                /* A range holds it: the path does not matter. */
                if (owner != users_owner(uid, NULL))
                        abort();
        } else if (uid < USERS_SUBORDINATE_MIN && owner != uid) {
                abort();                /* a login's own uid taken for another's by its path */
        }
        /* The same file again: the same answer. */
        if (users_load(path, &skipped) != n || users_owner(uid, cgroup) != owner)
                abort();
        /* Every line "OWNER:START:COUNT" of a numeric owner that no other line's range overlaps is a range of its owner's. */
        if (lines <= CHECKED_LINES)
                check_isolated(data, size);
        close(fd);
        users_reset();
        return 0;
}
