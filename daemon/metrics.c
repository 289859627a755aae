/*
 * metrics.c: the daemon's state in the Prometheus text format. Names follow the Prometheus
 * conventions: a gpupool_ prefix, base units (bytes), counters ending in _total; devices are
 * labelled by index and UUID, tenants by name, and nothing by pid, so that the number of
 * series stays bounded whatever the clients do.
 */
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "node.h"
#include "objects.h"
#include "session.h"

/* Every family prints at most this many series, each line at most METRICS_LINE_MAX bytes. */
#define METRICS_LINE_MAX 128
#define METRICS_DEVICE_FAMILIES 15
#define METRICS_TENANT_FAMILIES 3
#define METRICS_RESERVATION_FAMILIES 3
#define METRICS_RESERVATION_LINE_MAX 160        /* a key of 63 bytes and a device */
#define METRICS_FAMILIES 31
#define METRICS_HEADER_MAX 320          /* a family's HELP and TYPE lines */
_Static_assert((METRICS_DEVICE_FAMILIES * BACKEND_MAX_DEVICES + METRICS_TENANT_FAMILIES * CONFIG_MAX_TENANTS +
                POLICY_REFUSAL_COUNT + 7) * METRICS_LINE_MAX +
                METRICS_RESERVATION_FAMILIES * RESERVATIONS_MAX * METRICS_RESERVATION_LINE_MAX +
                METRICS_FAMILIES * METRICS_HEADER_MAX <= METRICS_TEXT_MAX,
               "the metrics of every device, tenant and reservation fit METRICS_TEXT_MAX");
_Static_assert(METRICS_TEXT_MAX + 1024 <= GP_MAX_REPLY_BYTES, "a MetricsReply holds METRICS_TEXT_MAX");

static const char *const refusal_reasons[POLICY_REFUSAL_COUNT] = {
        [POLICY_REFUSED_CLIENT_LIMIT] = "client_limit",
        [POLICY_REFUSED_TENANT_LIMIT] = "tenant_limit",
        [POLICY_REFUSED_GUARANTEES] = "guarantees",
        [POLICY_REFUSED_DEVICE_FULL] = "device_full",
        [POLICY_REFUSED_BACKEND_ERROR] = "backend_error",
        [POLICY_REFUSED_UNREAD] = "unread_budget",
};

struct writer {
        char *buf;
        size_t size, len;
        bool full;
};

static void emit(struct writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(struct writer *w, const char *fmt, ...) {
        va_list ap;
        int n;

        if (w->full)
                return;
        va_start(ap, fmt);
        n = vsnprintf(w->buf + w->len, w->size - w->len, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t) n >= w->size - w->len) {
                w->full = true;
                return;
        }
        w->len += (size_t) n;
}

static void family(struct writer *w, const char *name, const char *type, const char *help) {
        emit(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A device's labels: its index and, where the backend has one, its UUID as nvidia-smi writes it. */
static void device_labels(const struct node *node, unsigned d, char *buf, size_t size) {
        const struct backend_device_info *info = &node->devices[d];
        char uuid[BACKEND_UUID_TEXT_MAX] = "";

        if (info->has_uuid)
                backend_uuid_text(info->uuid, info->mig, uuid);
        snprintf(buf, size, "device=\"%u\",uuid=\"%s\"", d, uuid);
}

/* One family with a series per device; field picks the value from the pool's stats or the node. */
enum device_field {
        F_TOTAL,
        F_RESERVED,
        F_IN_USE,
        F_CACHED,
        F_MAX_CACHED,
        F_ZEROING,
        F_LEASES,
        F_EVICTIONS,
        F_RECLAIMS,
        F_IDLE_RELEASES,
        F_WATERMARK_RELEASES,
        F_GPU_FREE,
        F_HEADROOM_RELEASES,
        F_OBJECTS,
        F_OBJECT_BYTES,
};

static const struct {
        const char *name, *type, *help;
} device_families[METRICS_DEVICE_FAMILIES] = {
        [F_TOTAL] = { "gpupool_device_total_bytes", "gauge", "Bytes of the device the pool may hand out." },
        [F_RESERVED] = { "gpupool_device_reserved_bytes", "gauge", "Bytes the pool holds from the device." },
        [F_IN_USE] = { "gpupool_device_in_use_bytes", "gauge", "Bytes in blocks clients hold, as they last reported." },
        [F_CACHED] = { "gpupool_device_cached_bytes", "gauge", "Bytes in free segments the node-wide cache keeps." },
        [F_MAX_CACHED] = { "gpupool_device_max_cached_bytes", "gauge", "The cache's watermark (max_cached)." },
        [F_ZEROING] = { "gpupool_device_zeroing_bytes", "gauge", "Bytes in segments being zeroed on the GPU for a lease that waits." },
        [F_LEASES] = { "gpupool_leases_total", "counter", "Segments the daemon leased to clients." },
        [F_EVICTIONS] = { "gpupool_evictions_total", "counter", "Cached segments released to make room for an allocation." },
        [F_RECLAIMS] = { "gpupool_reclaims_total", "counter", "Segments clients gave back when the daemon asked." },
        [F_IDLE_RELEASES] = { "gpupool_idle_releases_total", "counter", "Cached segments released after idle_release." },
        [F_WATERMARK_RELEASES] = { "gpupool_watermark_releases_total", "counter",
                                   "Cached segments released to stay under max_cached." },
        [F_GPU_FREE] = { "gpupool_device_gpu_free_bytes", "gauge",
                         "Bytes free on the GPU, every process counted, at the last reading (cuda backend)." },
        [F_OBJECTS] = { "gpupool_objects", "gauge", "Named objects on the device (unpublished ones not yet gone included)." },
        [F_OBJECT_BYTES] = { "gpupool_object_bytes", "gauge", "Bytes named objects hold on the device, counted to their tenants." },
        [F_HEADROOM_RELEASES] = { "gpupool_headroom_releases_total", "counter",
                                  "Cached segments released because other processes took part of the headroom." },
};

static uint64_t device_value(const struct node *node, unsigned d, const struct pool_stats *st, enum device_field f) {
        switch (f) {
        case F_TOTAL:
                return st->total_bytes;
        case F_RESERVED:
                return st->reserved_bytes;
        case F_IN_USE:
                return st->in_use_bytes;
        case F_CACHED:
                return st->cached_bytes;
        case F_MAX_CACHED:
                return policy_max_cached(&node->policy, d);
        case F_ZEROING:
                return st->zeroing_bytes;
        case F_LEASES:
                return node->leases_total[d];
        case F_EVICTIONS:
                return st->evictions_total;
        case F_RECLAIMS:
                return node->reclaims_total[d];
        case F_IDLE_RELEASES:
                return st->idle_releases_total;
        case F_WATERMARK_RELEASES:
                return st->watermark_releases_total;
        case F_GPU_FREE:
                return st->gpu_free_bytes;
        case F_HEADROOM_RELEASES:
                return st->headroom_releases_total;
        case F_OBJECTS:
        case F_OBJECT_BYTES: {
                uint64_t n = 0, bytes = 0;

                for (const struct object *o = node->objects; o; o = o->next)
                        if (o->device == d) {
                                n++;
                                bytes += o->segment_size;
                        }
                return f == F_OBJECTS ? n : bytes;
        }
        }
        return 0;
}

static void devices(struct writer *w, const struct node *node) {
        struct pool_stats stats[BACKEND_MAX_DEVICES];
        char labels[BACKEND_MAX_DEVICES][96];

        for (unsigned d = 0; d < node->device_count; d++) {
                pool_get_stats(node->pools[d], &stats[d]);
                device_labels(node, d, labels[d], sizeof(labels[d]));
        }
        for (unsigned f = 0; f < METRICS_DEVICE_FAMILIES; f++) {
                family(w, device_families[f].name, device_families[f].type, device_families[f].help);
                for (unsigned d = 0; d < node->device_count; d++)
                        if (f != F_GPU_FREE || stats[d].gpu_known)     /* no series where the backend cannot tell */
                                emit(w, "%s{%s} %" PRIu64 "\n", device_families[f].name, labels[d],
                                     device_value(node, d, &stats[d], (enum device_field) f));
        }
}

static void tenants(struct writer *w, const struct node *node, const struct session *asking) {
        const struct policy *p = &node->policy;
        uint64_t reserved, in_use;

        family(w, "gpupool_tenant_clients", "gauge", "Clients of the tenant, connected or exiting.");
        for (unsigned i = 0; i < p->config_tenant_count; i++)
                emit(w, "gpupool_tenant_clients{tenant=\"%s\"} %u\n", p->tenants[i].conf.name,
                     p->tenants[i].clients - (asking && asking->tenant == &p->tenants[i]));
        family(w, "gpupool_tenant_reserved_bytes", "gauge", "Bytes the tenant's clients hold, on all devices.");
        for (unsigned i = 0; i < p->config_tenant_count; i++) {
                reserved = 0;
                for (unsigned d = 0; d < node->device_count; d++)
                        reserved += p->tenants[i].sums[d].reserved_bytes;
                emit(w, "gpupool_tenant_reserved_bytes{tenant=\"%s\"} %" PRIu64 "\n", p->tenants[i].conf.name, reserved);
        }
        family(w, "gpupool_tenant_in_use_bytes", "gauge", "Bytes in blocks the tenant's clients hold, on all devices, as they last reported.");
        for (unsigned i = 0; i < p->config_tenant_count; i++) {
                in_use = 0;
                for (unsigned d = 0; d < node->device_count; d++)
                        in_use += p->tenants[i].sums[d].in_use_bytes;
                emit(w, "gpupool_tenant_in_use_bytes{tenant=\"%s\"} %" PRIu64 "\n", p->tenants[i].conf.name, in_use);
        }
}

/* The reservations (a tenant's family would hold them too, but their number has a bound of its own). */
static void reservations(struct writer *w, const struct node *node) {
        static const struct {
                const char *name, *help;
        } families[METRICS_RESERVATION_FAMILIES] = {
                { "gpupool_reservation_guarantee_bytes", "Bytes on its GPU the reservation keeps for its pods." },
                { "gpupool_reservation_limit_bytes", "The most bytes its pods may hold on its GPU together." },
                { "gpupool_reservation_reserved_bytes", "Bytes its pods' clients hold on its GPU (named objects too)." },
        };
        const struct policy *p = &node->policy;

        family(w, "gpupool_reservations", "gauge", "Reservations kept, whether their GPU is among the daemon's or not (absent ones have no series below).");
        emit(w, "gpupool_reservations %u\n", node->reservations.count);
        for (unsigned f = 0; f < METRICS_RESERVATION_FAMILIES; f++) {
                family(w, families[f].name, "gauge", families[f].help);
                for (unsigned i = p->config_tenant_count; i < p->tenant_count; i++) {
                        const struct tenant *t = &p->tenants[i];
                        unsigned d = t->conf.device;
                        uint64_t v = f == 0 ? t->guarantee_bytes : f == 1 ? t->max_bytes : t->sums[d].reserved_bytes;

                        emit(w, "%s{reservation=\"%s\",device=\"%u\"} %" PRIu64 "\n", families[f].name, t->conf.name, d, v);
                }
        }
}

int metrics_format(const struct node *node, const struct session *asking, char *buf, size_t size) {
        struct writer w = { .buf = buf, .size = size };
        unsigned connected = 0, exiting = 0;

        if (!size)
                return -ENOBUFS;
        buf[0] = '\0';
        /* Clients as status counts them: not control channels, and not the one asking. */
        SESSION_FOREACH(c, node) {
                if (c == asking || c->control_of || c->state == SESSION_NEW || c->state == SESSION_CLOSED)
                        continue;
                connected += c->state == SESSION_READY;
                exiting += c->state == SESSION_EXITING;
        }
        family(&w, "gpupool_build_info", "gauge", "The daemon's version and backend; always 1.");
        emit(&w, "gpupool_build_info{version=\"%s\",backend=\"%s\"} 1\n", GPUPOOL_VERSION, node->backend->name);
        family(&w, "gpupool_clients", "gauge",
               "Clients connected, and clients gone whose process still runs (their memory is held until it exits).");
        emit(&w, "gpupool_clients{state=\"connected\"} %u\ngpupool_clients{state=\"exiting\"} %u\n", connected, exiting);
        devices(&w, node);
        family(&w, "gpupool_refusals_total", "counter", "Leases refused, by reason.");
        for (unsigned r = 0; r < POLICY_REFUSAL_COUNT; r++)
                emit(&w, "gpupool_refusals_total{reason=\"%s\"} %" PRIu64 "\n", refusal_reasons[r], node->refusals_total[r]);
        family(&w, "gpupool_unread_descriptors", "gauge",
               "Descriptors sent to clients (and to ended sessions' sockets kept open) that their peers have not read: the "
               "kernel counts them against the daemon's RLIMIT_NOFILE.");
        emit(&w, "gpupool_unread_descriptors %" PRIu64 "\n", node->unread_fds);
        family(&w, "gpupool_unread_descriptors_limit", "gauge",
               "The node's bounds on them: the budget any group may fill, and the ceiling past it for groups that hold little.");
        emit(&w, "gpupool_unread_descriptors_limit{bound=\"budget\"} %" PRIu64 "\n"
                 "gpupool_unread_descriptors_limit{bound=\"ceiling\"} %" PRIu64 "\n",
             node->unread_budget, node->unread_ceiling);
        tenants(&w, node, asking);
        reservations(&w, node);
        return w.full ? -ENOBUFS : (int) w.len;
}
