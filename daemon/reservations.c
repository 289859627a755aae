/* reservations.c: the table of reservations and its file (see reservations.h). */
#define _GNU_SOURCE
#include "reservations.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "size.h"

#define HEADER "gpupool-reservations 1"
#define LINE_MAX_BYTES 2048     /* a reservation of 16 pods is under 900 bytes; one of a token, 400 */

bool reservation_pod_uid_ok(const char *t) {
        if (strlen(t) != RESERVATION_POD_UID_LEN)
                return false;
        for (int i = 0; i < RESERVATION_POD_UID_LEN; i++) {
                bool dash = i == 8 || i == 13 || i == 18 || i == 23;

                if (dash ? t[i] != '-' : !((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
                        return false;
        }
        return true;
}

bool reservation_token_ok(const char *t) {
        size_t n = strlen(t);

        if (n < RESERVATION_TOKEN_MIN || n > RESERVATION_TOKEN_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((t[i] >= 'a' && t[i] <= 'z') || (t[i] >= 'A' && t[i] <= 'Z') || (t[i] >= '0' && t[i] <= '9') ||
                      t[i] == '-' || t[i] == '_'))
                        return false;
        return true;
}

static bool key_ok(const char *k) {
        size_t n = strlen(k);

        if (n == 0 || n > RESERVATION_KEY_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') || (k[i] >= '0' && k[i] <= '9') ||
                      k[i] == '-' || k[i] == '_' || k[i] == '.'))
                        return false;
        return true;
}

int reservation_check(const struct reservation *r, char *why, size_t why_size) {
        char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];

        if (!key_ok(r->key)) {
                snprintf(why, why_size, "a reservation's key is 1 to %d letters, digits, '-', '_' or '.'", RESERVATION_KEY_MAX);
                return -EINVAL;
        }
        if (strcmp(r->key, CONFIG_DEFAULT_TENANT) == 0) {
                snprintf(why, why_size, "'%s' is the default tenant's name, not a reservation's key", r->key);
                return -EINVAL;
        }
        if (r->limit_bytes == 0) {
                snprintf(why, why_size, "reservation %s: a limit of 0 would let its pods have nothing", r->key);
                return -EINVAL;
        }
        if (r->guarantee_bytes > r->limit_bytes) {
                snprintf(why, why_size, "reservation %s: a guarantee of %s is more than its limit of %s", r->key,
                         gp_size_format(r->guarantee_bytes, b1, sizeof(b1)), gp_size_format(r->limit_bytes, b2, sizeof(b2)));
                return -EINVAL;
        }
        if (r->token[0] && !reservation_token_ok(r->token)) {
                snprintf(why, why_size, "reservation %s: a token is %d to %d letters, digits, '-' or '_'", r->key,
                         RESERVATION_TOKEN_MIN, RESERVATION_TOKEN_MAX);
                return -EINVAL;
        }
        if (r->token[0] && r->pod_count > 1) {
                snprintf(why, why_size, "reservation %s: a token binds one pod, the first to present it", r->key);
                return -EINVAL;
        }
        if ((r->pod_count == 0 && !r->token[0]) || r->pod_count > RESERVATION_PODS_MAX) {
                snprintf(why, why_size, "reservation %s: it is for 1 to %d pods, named by their UIDs, or for the pod that "
                         "presents its token", r->key, RESERVATION_PODS_MAX);
                return -EINVAL;
        }
        for (unsigned i = 0; i < r->pod_count; i++) {
                if (!reservation_pod_uid_ok(r->pods[i])) {
                        snprintf(why, why_size, "reservation %s: '%.40s' is not a pod UID (8-4-4-4-12 lower-case hex digits)",
                                 r->key, r->pods[i]);
                        return -EINVAL;
                }
                for (unsigned j = 0; j < i; j++)
                        if (strcmp(r->pods[i], r->pods[j]) == 0) {
                                snprintf(why, why_size, "reservation %s names pod %s twice", r->key, r->pods[i]);
                                return -EINVAL;
                        }
        }
        return 0;
}

struct reservation *reservations_find(struct reservations *rs, const char *key) {
        for (unsigned i = 0; i < rs->count; i++)
                if (strcmp(rs->r[i].key, key) == 0)
                        return &rs->r[i];
        return NULL;
}

const struct reservation *reservations_of_pod(const struct reservations *rs, const char *pod_uid) {
        for (unsigned i = 0; i < rs->count; i++)
                for (unsigned j = 0; j < rs->r[i].pod_count; j++)
                        if (strcmp(rs->r[i].pods[j], pod_uid) == 0)
                                return &rs->r[i];
        return NULL;
}

struct reservation *reservations_of_token(struct reservations *rs, const char *token) {
        size_t n = strlen(token);
        struct reservation *found = NULL;

        for (unsigned i = 0; i < rs->count; i++) {
                const char *t = rs->r[i].token;
                size_t tn = strnlen(t, RESERVATION_TOKEN_MAX);
                unsigned char diff = tn != n;

                /* Every byte of each, wherever they differ: how long it takes tells nothing of the token. */
                for (size_t j = 0; j < RESERVATION_TOKEN_MAX; j++)
                        diff |= (unsigned char) ((j < n ? token[j] : 0) ^ (j < tn ? t[j] : 0));
                if (!diff && t[0] && !found)
                        found = &rs->r[i];
        }
        return found;
}

/* Whether a and b say the same (their unused pod slots aside). */
static bool same(const struct reservation *a, const struct reservation *b) {
        if (strcmp(a->key, b->key) || a->generation != b->generation || a->device != b->device ||
            strcmp(a->device_uuid, b->device_uuid) || a->guarantee_bytes != b->guarantee_bytes ||
            a->limit_bytes != b->limit_bytes || a->pod_count != b->pod_count || a->absent != b->absent ||
            strcmp(a->token, b->token))
                return false;
        for (unsigned i = 0; i < a->pod_count; i++)
                if (strcmp(a->pods[i], b->pods[i]))
                        return false;
        return true;
}

int reservations_put(struct reservations *rs, const struct reservation *in, char *why, size_t why_size) {
        struct reservation *old = reservations_find(rs, in->key), copy = *in, *r = &copy;

        /* The same token again keeps the pod it bound. */
        if (old && r->token[0] && r->pod_count == 0 && strcmp(old->token, r->token) == 0) {
                r->pod_count = old->pod_count;
                memcpy(r->pods, old->pods, sizeof(r->pods));
        }
        if (old && r->generation == old->generation) {
                if (same(old, r))
                        return 0;
                snprintf(why, why_size, "reservation %s is at generation %" PRIu64 " with other values: a change takes a "
                         "higher generation", r->key, old->generation);
                return -EEXIST;
        }
        if (old && r->generation < old->generation) {
                snprintf(why, why_size, "reservation %s is at generation %" PRIu64 ": generation %" PRIu64 " is older",
                         r->key, old->generation, r->generation);
                return -ESTALE;
        }
        if (r->token[0]) {
                const struct reservation *other = reservations_of_token(rs, r->token);

                if (other && other != old) {
                        snprintf(why, why_size, "reservation %s has that token already: a token is one reservation's",
                                 other->key);
                        return -EBUSY;
                }
        }
        for (unsigned i = 0; i < r->pod_count; i++) {
                const struct reservation *other = reservations_of_pod(rs, r->pods[i]);

                if (other && other != old) {
                        snprintf(why, why_size, "pod %s has reservation %s already: one reservation per pod", r->pods[i],
                                 other->key);
                        return -EBUSY;
                }
        }
        if (!old && rs->count == RESERVATIONS_MAX) {
                snprintf(why, why_size, "the node has %d reservations, the most it keeps: delete one first", RESERVATIONS_MAX);
                return -ENOSPC;
        }
        if (!old)
                old = &rs->r[rs->count++];
        *old = *r;
        for (unsigned i = r->pod_count; i < RESERVATION_PODS_MAX; i++)
                old->pods[i][0] = '\0';
        return 1;
}

bool reservations_delete(struct reservations *rs, const char *key) {
        struct reservation *r = reservations_find(rs, key);

        if (!r)
                return false;
        /* The order is the order of their puts: the tenants follow it. */
        memmove(r, r + 1, (size_t) (&rs->r[rs->count] - (r + 1)) * sizeof(*r));
        rs->count--;
        return true;
}

/* Parses an unsigned decimal of 1 to 20 digits. */
static int parse_u64(const char *t, uint64_t *ret) {
        char *end;

        if (*t < '0' || *t > '9')
                return -EINVAL;
        errno = 0;
        *ret = strtoull(t, &end, 10);
        return errno || *end ? -EINVAL : 0;
}

/* Parses one line's fields into r; on failure why says which field and what. */
static int parse_line(char *line, struct reservation *r, char *why, size_t why_size) {
        enum { F_KEY = 1, F_GEN = 2, F_DEV = 4, F_UUID = 8, F_GUAR = 16, F_LIMIT = 32, F_PODS = 64, F_TOKEN = 128,
               F_ALL = 127 };
        unsigned seen = 0;
        char *save = NULL;

        memset(r, 0, sizeof(*r));
        for (char *f = strtok_r(line, " ", &save); f; f = strtok_r(NULL, " ", &save)) {
                char *v = strchr(f, '=');
                unsigned bit;
                uint64_t n = 0;
                int bad = 0;

                if (!v) {
                        snprintf(why, why_size, "'%.40s' is no key=value field", f);
                        return -EINVAL;
                }
                *v++ = '\0';
                if (strcmp(f, "key") == 0) {
                        bit = F_KEY;
                        bad = strlen(v) > RESERVATION_KEY_MAX;
                        if (!bad)
                                snprintf(r->key, sizeof(r->key), "%s", v);
                } else if (strcmp(f, "generation") == 0) {
                        bit = F_GEN;
                        bad = parse_u64(v, &r->generation);
                } else if (strcmp(f, "device") == 0) {
                        bit = F_DEV;
                        bad = parse_u64(v, &n) || n >= CONFIG_MAX_DEVICES;
                        r->device = (uint32_t) n;
                } else if (strcmp(f, "uuid") == 0) {
                        bit = F_UUID;
                        bad = strlen(v) > RESERVATION_UUID_MAX || (strncmp(v, "GPU-", 4) && strncmp(v, "MIG-", 4) &&
                                                                   strcmp(v, "-"));
                        if (!bad && strcmp(v, "-"))
                                snprintf(r->device_uuid, sizeof(r->device_uuid), "%s", v);
                } else if (strcmp(f, "guarantee") == 0) {
                        bit = F_GUAR;
                        bad = parse_u64(v, &r->guarantee_bytes);
                } else if (strcmp(f, "limit") == 0) {
                        bit = F_LIMIT;
                        bad = parse_u64(v, &r->limit_bytes);
                } else if (strcmp(f, "token") == 0) {
                        bit = F_TOKEN;
                        bad = !reservation_token_ok(v);
                        if (!bad)
                                snprintf(r->token, sizeof(r->token), "%s", v);
                } else if (strcmp(f, "pods") == 0) {
                        char *psave = NULL;

                        bit = F_PODS;
                        for (char *p = strtok_r(strcmp(v, "-") ? v : v + 1, ",", &psave); p && !bad;
                             p = strtok_r(NULL, ",", &psave)) {
                                bad = r->pod_count == RESERVATION_PODS_MAX || strlen(p) > RESERVATION_POD_UID_LEN;
                                if (!bad)
                                        snprintf(r->pods[r->pod_count++], sizeof(r->pods[0]), "%s", p);
                        }
                } else {
                        snprintf(why, why_size, "unknown field '%.40s'", f);
                        return -EINVAL;
                }
                if (seen & bit) {
                        snprintf(why, why_size, "field '%s' twice", f);
                        return -EINVAL;
                }
                if (bad) {
                        snprintf(why, why_size, "%s: '%.60s' is not a valid value", f, v);
                        return -EINVAL;
                }
                seen |= bit;
        }
        if ((seen & F_ALL) != F_ALL) {
                snprintf(why, why_size, "a reservation's line has key, generation, device, uuid, guarantee, limit and pods "
                         "(and a token where it has one)");
                return -EINVAL;
        }
        return reservation_check(r, why, why_size);
}

static int load_from(FILE *f, const char *path, struct reservations *ret, char *err, size_t err_size) {
        char line[LINE_MAX_BYTES + 2], why[300];
        bool header = false;
        int n = 0;

        ret->count = 0;
        while (fgets(line, sizeof(line), f)) {
                size_t len = strlen(line);
                struct reservation r;

                n++;
                if (len && line[len - 1] == '\n')
                        line[--len] = '\0';
                else if (!feof(f)) {
                        snprintf(err, err_size, "%s:%d: a line longer than %d bytes", path, n, LINE_MAX_BYTES);
                        return -EINVAL;
                }
                if (line[0] == '#' || line[0] == '\0')
                        continue;
                if (!header) {
                        if (strcmp(line, HEADER)) {
                                snprintf(err, err_size, "%s:%d: the file does not start with '%s': not a reservations file "
                                         "of this version", path, n, HEADER);
                                return -EINVAL;
                        }
                        header = true;
                        continue;
                }
                if (parse_line(line, &r, why, sizeof(why)) < 0) {
                        snprintf(err, err_size, "%s:%d: %s", path, n, why);
                        return -EINVAL;
                }
                if (reservations_find(ret, r.key)) {
                        snprintf(err, err_size, "%s:%d: reservation %s twice", path, n, r.key);
                        return -EINVAL;
                }
                if (reservations_put(ret, &r, why, sizeof(why)) < 0) {
                        snprintf(err, err_size, "%s:%d: %s", path, n, why);
                        return -EINVAL;
                }
        }
        if (ferror(f)) {
                snprintf(err, err_size, "%s: %s", path, strerror(EIO));
                return -EIO;
        }
        if (!header && n) {
                snprintf(err, err_size, "%s: no '%s' line: not a reservations file", path, HEADER);
                return -EINVAL;
        }
        return 0;
}

int reservations_load(const char *dir, struct reservations *ret, char *err, size_t err_size) {
        char path[PATH_MAX];
        FILE *f;
        int r;

        ret->count = 0;
        if (snprintf(path, sizeof(path), "%s/%s", dir, RESERVATIONS_FILE) >= (int) sizeof(path)) {
                snprintf(err, err_size, "%s: the state directory's path is too long", dir);
                return -ENAMETOOLONG;
        }
        f = fopen(path, "re");
        if (!f) {
                if (errno == ENOENT)
                        return 0;
                r = -errno;
                snprintf(err, err_size, "cannot read %s: %s", path, strerror(-r));
                return r;
        }
        r = load_from(f, path, ret, err, err_size);
        fclose(f);
        if (r < 0)
                ret->count = 0;
        return r;
}

/* Writes the table's text into f. */
static void write_to(FILE *f, const struct reservations *rs) {
        fprintf(f, "# gpupool's reservations, written by gpupoold: change them with gpupoolctl reserve and unreserve\n%s\n",
                HEADER);
        for (unsigned i = 0; i < rs->count; i++) {
                const struct reservation *r = &rs->r[i];

                fprintf(f, "key=%s generation=%" PRIu64 " device=%u uuid=%s guarantee=%" PRIu64 " limit=%" PRIu64 " pods=",
                        r->key, r->generation, r->device, r->device_uuid[0] ? r->device_uuid : "-", r->guarantee_bytes,
                        r->limit_bytes);
                for (unsigned j = 0; j < r->pod_count; j++)
                        fprintf(f, "%s%s", j ? "," : "", r->pods[j]);
                if (!r->pod_count)
                        fputc('-', f);
                if (r->token[0])
                        fprintf(f, " token=%s", r->token);
                fputc('\n', f);
        }
}

int reservations_save(const char *dir, const struct reservations *rs, char *err, size_t err_size) {
        char path[PATH_MAX], tmp[PATH_MAX];
        int fd, dfd, r = 0;
        FILE *f;

        if (snprintf(path, sizeof(path), "%s/%s", dir, RESERVATIONS_FILE) >= (int) sizeof(path) ||
            snprintf(tmp, sizeof(tmp), "%s/.%s.new", dir, RESERVATIONS_FILE) >= (int) sizeof(tmp)) {
                snprintf(err, err_size, "%s: the state directory's path is too long", dir);
                return -ENAMETOOLONG;
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
                r = -errno;
                snprintf(err, err_size, "cannot write %s: %s", tmp, strerror(-r));
                return r;
        }
        f = fdopen(fd, "w");
        if (!f) {
                r = -errno;
                close(fd);
                unlink(tmp);
                snprintf(err, err_size, "cannot write %s: %s", tmp, strerror(-r));
                return r;
        }
        errno = 0;
        write_to(f, rs);
        /* The new file is whole on the disk before its name replaces the old one's. */
        if (fflush(f) != 0 || ferror(f) || fsync(fd) < 0)
                r = errno ? -errno : -EIO;
        if (fclose(f) != 0 && !r)
                r = -errno;
        if (!r && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0) {
                unlink(tmp);
                snprintf(err, err_size, "cannot write %s: %s", path, strerror(-r));
                return r;
        }
        /*
         * And the rename is on the disk before the put is answered. The new table is the file's
         * now, synced or not: a failure here is worth a line, not a refusal of what is done.
         */
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0)
                log_warn("cannot sync %s after writing %s: %s (a crash now may lose the last change)", dir, path,
                         strerror(errno));
        if (dfd >= 0)
                close(dfd);
        return 0;
}
