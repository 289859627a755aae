/*
 * reservations.h: the node's reservations, and the file in the daemon's state directory that
 * keeps them across restarts.
 *
 * A reservation is memory on one GPU set aside for a pod, made by an operator's tool (the
 * device plugin, gpupoolctl reserve) rather than by the config file: a guarantee no other
 * tenant can take, and a limit the pod's processes together may not pass. Policy makes each a
 * tenant of that one device, matched by the pods' UIDs before any tenant of the config
 * (policy_reserve()); this file keeps the table and its file, and decides nothing about memory.
 *
 * A put is idempotent by key and generation: the same generation again with the same values
 * changes nothing, with other values is refused, an older one is refused, a newer one
 * replaces. One reservation per pod: a pod is one tenant. A reservation names its pods, or
 * holds a token that binds it to the first pod whose process presents it; a put of the same
 * token keeps the pod it is bound to.
 *
 * The file, DIR/reservations, is text: a header line, then one line per reservation of
 * key=value fields (reservations_save()). It is written to a new file, synced, renamed over
 * the old and the directory synced, so that a crash at any point leaves the old table or the
 * new, never a mix or none.
 */
#ifndef GP_RESERVATIONS_H
#define GP_RESERVATIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "wire.h"

#define RESERVATIONS_MAX 64
#define RESERVATION_KEY_MAX CONFIG_NAME_MAX     /* a reservation is a tenant: its key is the tenant's name */
#define RESERVATION_PODS_MAX 16
#define RESERVATION_POD_UID_LEN 36              /* 8-4-4-4-12 lower-case hex, as Kubernetes writes it */
#define RESERVATION_UUID_MAX 40                 /* "GPU-" or "MIG-" and the UUID (backend.h) */
#define RESERVATION_TOKEN_MIN 16
#define RESERVATION_TOKEN_MAX GP_RESERVATION_TOKEN_MAX /* letters, digits, '-' and '_' (base64url) */
#define RESERVATIONS_FILE "reservations"

struct reservation {
        char key[RESERVATION_KEY_MAX + 1];      /* 1 to 63 letters, digits, '-', '_' or '.' */
        uint64_t generation;
        uint32_t device;                        /* the GPU's index in the daemon */
        char device_uuid[RESERVATION_UUID_MAX + 1];     /* its UUID, "" where the backend has none */
        uint64_t guarantee_bytes;
        uint64_t limit_bytes;                   /* at least the guarantee, and not 0 */
        unsigned pod_count;
        char pods[RESERVATION_PODS_MAX][RESERVATION_POD_UID_LEN + 1];
        /*
         * Or, for a pod not known when it was made, a secret its processes present
         * ($GPUPOOL_RESERVATION): the first pod to present it is its pod from then on ("": none).
         */
        char token[RESERVATION_TOKEN_MAX + 1];
        /* Its GPU is not among the daemon's (gone since it was made): kept, listed, and no tenant. Not in the file. */
        bool absent;
};

struct reservations {
        unsigned count;
        struct reservation r[RESERVATIONS_MAX];
};

/* Whether text is a pod UID as Kubernetes writes it. */
bool reservation_pod_uid_ok(const char *text);

/* Whether text is a token: RESERVATION_TOKEN_MIN to _MAX letters, digits, '-' or '_'. */
bool reservation_token_ok(const char *text);

/* The reservation whose token is token (compared in time independent of where they differ), or NULL. */
struct reservation *reservations_of_token(struct reservations *rs, const char *token);

/*
 * Checks one reservation's fields on their own: the key, the limit against the guarantee, the
 * pods (well formed, none twice; none only with a token, and one at most with it), the token.
 * Returns 0, or -EINVAL with why.
 */
int reservation_check(const struct reservation *r, char *why, size_t why_size);

/* The reservation of key, or NULL. */
struct reservation *reservations_find(struct reservations *rs, const char *key);

/* The reservation whose pods include pod_uid, or NULL. */
const struct reservation *reservations_of_pod(const struct reservations *rs, const char *pod_uid);

/*
 * Puts r (checked) into rs. Returns 1 where rs changed, 0 where r is there already (same key,
 * generation and values), or with why: -EEXIST (same generation, other values), -ESTALE (an
 * older generation), -EBUSY (one of its pods has another reservation), -ENOSPC (full).
 */
int reservations_put(struct reservations *rs, const struct reservation *r, char *why, size_t why_size);

/* Deletes key's reservation. Returns whether there was one. */
bool reservations_delete(struct reservations *rs, const char *key);

/*
 * Reads dir/reservations into ret. A missing file is an empty table. Returns 0, or a negative
 * errno with "file:line: what" in err: the file is never half read.
 */
int reservations_load(const char *dir, struct reservations *ret, char *err, size_t err_size);

/* Writes rs to dir/reservations as the header says. Returns 0, or a negative errno with why. */
int reservations_save(const char *dir, const struct reservations *rs, char *err, size_t err_size);

#endif
