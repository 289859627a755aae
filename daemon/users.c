/* users.c: the user a uid is, from /etc/subuid's ranges and the login's slice (see users.h). */
#define _GNU_SOURCE
#include "users.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

struct range {
        uid_t start;
        uid_t count;
        uid_t owner;
};

/* The ranges by start, none overlapping; what the file was when read, to know it changed. */
static struct {
        struct range *ranges;
        size_t n;
        struct stat seen;
        bool seen_valid;
        uint64_t looked_ms;
        bool looked;
} users;

static int cmp_start(const void *a, const void *b) {
        const struct range *x = a, *y = b;

        return (x->start > y->start) - (x->start < y->start);
}

/* A whole decimal number of at most 32 bits, all of s. */
static bool parse_u32(const char *s, uint32_t *ret) {
        unsigned long long v;
        char *end;

        if (*s < '0' || *s > '9')
                return false;
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno || *end || v > UINT32_MAX)
                return false;
        *ret = (uint32_t) v;
        return true;
}

/* The owner named in a line: a uid, or a user's name the system knows. */
static bool owner_of(const char *name, uid_t *ret) {
        struct passwd pw, *found = NULL;
        char buf[4096];
        uint32_t v;

        if (parse_u32(name, &v)) {
                *ret = v;
                return true;
        }
        if (getpwnam_r(name, &pw, buf, sizeof(buf), &found) != 0 || !found)
                return false;
        *ret = found->pw_uid;
        return true;
}

/* One line "OWNER:START:COUNT" into *ret; false for one that is not. */
static bool parse_line(char *line, struct range *ret) {
        char *owner = line, *start, *count;
        uint32_t s, c;

        line[strcspn(line, "\r\n")] = '\0';
        if (!(start = strchr(owner, ':')))
                return false;
        *start++ = '\0';
        if (!(count = strchr(start, ':')))
                return false;
        *count++ = '\0';
        if (!*owner || !parse_u32(start, &s) || !parse_u32(count, &c) || c == 0 || (uint64_t) s + c > (uint64_t) UINT32_MAX + 1)
                return false;
        if (!owner_of(owner, &ret->owner))
                return false;
        ret->start = s;
        ret->count = c;
        return true;
}

int users_load(const char *path, unsigned *ret_skipped) {
        struct range *ranges = NULL;
        size_t n = 0, cap = 0, bytes = 0, kept = 0;
        unsigned skipped = 0;
        char line[512];
        struct stat st;
        FILE *f;

        f = fopen(path, "re");
        if (!f && errno != ENOENT)
                return -errno;
        if (f && fstat(fileno(f), &st) < 0) {
                int r = -errno;

                fclose(f);
                return r;
        }
        while (f && fgets(line, sizeof(line), f)) {
                struct range r;

                bytes += strlen(line);
                if (bytes > USERS_MAX_FILE_BYTES)
                        break;
                if (line[0] == '#' || line[strspn(line, " \t\r\n")] == '\0')
                        continue;
                if (!strchr(line, '\n') && !feof(f)) {
                        int ch;

                        while ((ch = fgetc(f)) != EOF && ch != '\n')    /* a line too long to be one: left out whole */
                                ;
                        skipped++;
                        continue;
                }
                if (!parse_line(line, &r)) {
                        skipped++;
                        continue;
                }
                if (n == USERS_MAX_RANGES) {
                        skipped++;
                        continue;
                }
                if (n == cap) {
                        size_t want = cap ? cap * 2 : 64;
                        struct range *more = realloc(ranges, want * sizeof(*ranges));

                        if (!more) {
                                free(ranges);
                                fclose(f);
                                return -ENOMEM;
                        }
                        ranges = more;
                        cap = want;
                }
                ranges[n++] = r;
        }
        if (f)
                fclose(f);
        /* Sorted by start; a range that overlaps the one kept before it is left out (shadow never makes one). */
        if (n)
                qsort(ranges, n, sizeof(*ranges), cmp_start);
        for (size_t i = 0; i < n; i++) {
                if (kept && (uint64_t) ranges[kept - 1].start + ranges[kept - 1].count > ranges[i].start) {
                        skipped++;
                        continue;
                }
                ranges[kept++] = ranges[i];
        }
        free(users.ranges);
        users.ranges = ranges;
        users.n = kept;
        users.seen_valid = f != NULL;
        if (f)
                users.seen = st;
        if (ret_skipped)
                *ret_skipped = skipped;
        return (int) kept;
}

void users_refresh(const char *path, uint64_t now_ms) {
        unsigned skipped = 0;
        struct stat st;
        bool exists;
        int r;

        if (users.looked && now_ms - users.looked_ms < 1000)
                return;
        users.looked = true;
        users.looked_ms = now_ms;
        exists = stat(path, &st) == 0;
        if (exists == users.seen_valid &&
            (!exists || (st.st_ino == users.seen.st_ino && st.st_size == users.seen.st_size &&
                         st.st_mtim.tv_sec == users.seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == users.seen.st_mtim.tv_nsec)))
                return;
        r = users_load(path, &skipped);
        if (r < 0)
                log_warn("users: reading %s: %s; its subordinate uids are counted as before", path, strerror(-r));
        else
                log_info("users: %d subordinate uid range%s in %s (each counted as its owner's)%s", r, r == 1 ? "" : "s", path,
                         skipped ? "; some lines left out: not OWNER:START:COUNT of a known user, or overlapping" : "");
}

/* The uid N of a login's slice the cgroup path lies in (/user.slice/user-N.slice/...), or -1. */
static long long slice_user(const char *cgroup) {
        static const char prefix[] = "/user.slice/user-";
        unsigned long long v;
        char *end;

        if (!cgroup || strncmp(cgroup, prefix, sizeof(prefix) - 1) != 0)
                return -1;
        cgroup += sizeof(prefix) - 1;
        if (*cgroup < '0' || *cgroup > '9')
                return -1;
        errno = 0;
        v = strtoull(cgroup, &end, 10);
        if (errno || v > UINT32_MAX || strncmp(end, ".slice", 6) != 0 || (end[6] != '/' && end[6] != '\0'))
                return -1;
        return (long long) v;
}

uid_t users_owner(uid_t uid, const char *cgroup) {
        size_t lo = 0, hi = users.n;
        long long login;

        /* The last range starting at or below uid. */
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (users.ranges[mid].start <= uid)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (lo && (uint64_t) uid < (uint64_t) users.ranges[lo - 1].start + users.ranges[lo - 1].count)
                return users.ranges[lo - 1].owner;
        if (uid >= USERS_SUBORDINATE_MIN && (login = slice_user(cgroup)) >= 0)
                return (uid_t) login;
        return uid;
}

void users_reset(void) {
        free(users.ranges);
        memset(&users, 0, sizeof(users));
}
