/*
 * make_seeds.c: writes the protocol fuzzer's seed corpus (tests/fuzz/corpus/protocol), in
 * fuzz_protocol.c's input format: sessions of well-formed requests, so the fuzzer starts from
 * every handler rather than from the decoder's first refusal. "make fuzz-seeds" runs it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static FILE *out;

/* Appends one packet: flags, length, the packed envelope. */
static void packet(uint8_t flags, Gpupool__Envelope *env) {
        uint8_t buf[GP_MAX_REQUEST_BYTES];
        int n;

        env->version = GP_PROTOCOL_VERSION;
        n = gp_wire_pack(env, buf, sizeof(buf));
        if (n < 0)
                exit(1);
        fputc(flags, out);
        fputc(n & 0xff, out);
        fputc(n >> 8, out);
        fwrite(buf, 1, (size_t) n, out);
}

static void begin(const char *dir, const char *name) {
        char path[512];

        snprintf(path, sizeof(path), "%s/%s", dir, name);
        out = fopen(path, "wb");
        if (!out)
                exit(1);
}

static void hello(uint64_t control_for) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__Hello h = GPUPOOL__HELLO__INIT;

        h.name = "seed";
        h.has_control_for = control_for != 0;
        h.control_for = control_for;
        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = &h;
        packet(control_for ? 2 | 4 : 0, &env);
}

static void lease(uint64_t id, uint64_t size) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__LeaseRequest l = GPUPOOL__LEASE_REQUEST__INIT;

        l.size = size;
        env.id = id;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        env.lease = &l;
        packet(0, &env);
}

/* A lease with exact set: a segment of the size rounded to 2 MiB, not a larger cached one. */
static void lease_exact(uint64_t id, uint64_t size, bool granule) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__LeaseRequest l = GPUPOOL__LEASE_REQUEST__INIT;

        l.size = size;
        l.has_exact = l.exact = 1;
        l.has_granules = granule;
        l.granules = granule;
        env.id = id;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        env.lease = &l;
        packet(0, &env);
}

static void lease_granules(uint64_t id, uint32_t granules) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__LeaseRequest l = GPUPOOL__LEASE_REQUEST__INIT;

        l.size = 2u << 20;
        l.has_granules = 1;
        l.granules = granules;
        env.id = id;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        env.lease = &l;
        packet(0, &env);
}

static void return_segment(uint64_t id, uint64_t segment) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__ReturnRequest r = GPUPOOL__RETURN_REQUEST__INIT;

        r.n_segment_ids = 1;
        r.segment_ids = &segment;
        env.id = id;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
        env.return_segments = &r;
        packet(0, &env);
}

static void simple(uint64_t id, Gpupool__Envelope__BodyCase body, void *msg) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;

        env.id = id;
        env.body_case = body;
        env.status_request = msg;       /* every body member shares the union's storage */
        packet(0, &env);
}

int main(int argc, char **argv) {
        const char *dir = argc > 1 ? argv[1] : "tests/fuzz/corpus/protocol";
        Gpupool__StatusRequest st = GPUPOOL__STATUS_REQUEST__INIT;
        Gpupool__FlushRequest fl = GPUPOOL__FLUSH_REQUEST__INIT;
        Gpupool__ByeRequest bye = GPUPOOL__BYE_REQUEST__INIT;
        Gpupool__SetLimitRequest sl = GPUPOOL__SET_LIMIT_REQUEST__INIT;
        Gpupool__TrimRequest tr = GPUPOOL__TRIM_REQUEST__INIT;
        Gpupool__CheckRequest ck = GPUPOOL__CHECK_REQUEST__INIT;
        Gpupool__ReclaimReply rr = GPUPOOL__RECLAIM_REPLY__INIT;
        uint64_t seg = (0ULL << 56) | 1, ids[1] = { seg };

        /* The daemon's first segment id on device 0 is 1: returns of it are valid. */
        begin(dir, "lease-return-bye");
        hello(0);
        lease(2, 4096);
        lease(3, 100000);
        return_segment(4, seg);
        return_segment(5, seg);         /* twice: not found */
        lease(6, 4096);                 /* the cached one again */
        simple(7, GPUPOOL__ENVELOPE__BODY_BYE, &bye);
        fclose(out);

        begin(dir, "granule-leases");
        hello(0);
        lease_granules(2, 3);
        lease_granules(3, 0);           /* refused: none */
        lease_granules(4, 129);         /* refused: too many */
        return_segment(5, seg);
        lease_granules(6, 1);           /* the cached one again */
        fclose(out);

        begin(dir, "exact-leases");
        hello(0);
        lease(2, 24u << 20);
        return_segment(3, seg);
        lease_exact(4, 20u << 20, false);       /* not the cached 24 MiB */
        lease_exact(5, 23u << 20, false);       /* the cached one: 24 MiB exactly */
        lease_exact(6, 2u << 20, true);         /* refused: a granule lease */
        fclose(out);

        /* Adoptions by the process's word (cuda-vmm's): refused on the host backend the fuzzer runs, and malformed. */
        begin(dir, "held-adoptions");
        hello(0);
        {
                Gpupool__AdoptRequest ar = GPUPOOL__ADOPT_REQUEST__INIT;
                uint64_t sizes[2] = { 2u << 20, 4u << 20 };

                ar.sizes = sizes;
                ar.n_sizes = 2;
                ar.has_held = ar.held = true;
                simple(2, GPUPOOL__ENVELOPE__BODY_ADOPT, &ar);
                ar.n_sizes = 0;
                simple(3, GPUPOOL__ENVELOPE__BODY_ADOPT, &ar);
                ar.n_sizes = 1;
                sizes[0] = 3u << 20;            /* no segment's size */
                simple(4, GPUPOOL__ENVELOPE__BODY_ADOPT, &ar);
        }
        fclose(out);

        /* Memory queries, and charges of memory outside the pool: good, refused, and released. */
        begin(dir, "meminfo-charges");
        hello(0);
        {
                Gpupool__MemInfoRequest mi = GPUPOOL__MEM_INFO_REQUEST__INIT;
                Gpupool__ChargeRequest cr = GPUPOOL__CHARGE_REQUEST__INIT;

                simple(2, GPUPOOL__ENVELOPE__BODY_MEM_INFO, &mi);
                cr.bytes = 4u << 20;
                simple(3, GPUPOOL__ENVELOPE__BODY_CHARGE, &cr);
                cr.bytes = 0;
                simple(4, GPUPOOL__ENVELOPE__BODY_CHARGE, &cr);        /* refused: nothing */
                cr.device = 9;
                cr.bytes = 1;
                simple(5, GPUPOOL__ENVELOPE__BODY_CHARGE, &cr);        /* refused: no such device */
                cr.device = 0;
                cr.has_release = cr.release = 1;
                cr.bytes = 2u << 20;
                simple(6, GPUPOOL__ENVELOPE__BODY_CHARGE, &cr);
                cr.bytes = 8u << 20;
                simple(7, GPUPOOL__ENVELOPE__BODY_CHARGE, &cr);        /* refused: more than charged */
                lease(8, 4096);
                simple(9, GPUPOOL__ENVELOPE__BODY_MEM_INFO, &mi);
        }
        fclose(out);

        begin(dir, "status-flush-check");
        hello(0);
        lease(2, 12u << 20);
        simple(3, GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST, &st);
        fl.has_device = 1;
        simple(4, GPUPOOL__ENVELOPE__BODY_FLUSH, &fl);
        simple(5, GPUPOOL__ENVELOPE__BODY_CHECK, &ck);
        fclose(out);

        begin(dir, "limits-and-trim");
        hello(0);
        sl.tenant = "default";
        sl.has_max_bytes = 1;
        sl.max_bytes = 8u << 20;
        simple(2, GPUPOOL__ENVELOPE__BODY_SET_LIMIT, &sl);
        lease(3, 10u << 20);
        tr.tenant = "default";
        simple(4, GPUPOOL__ENVELOPE__BODY_TRIM, &tr);
        fl.tenant = "default";
        simple(5, GPUPOOL__ENVELOPE__BODY_FLUSH, &fl);
        fclose(out);

        begin(dir, "lease-and-control");
        hello(0);
        lease(2, 65536);
        hello(1);               /* the second client: control channel of client 1 */
        rr.n_segment_ids = 1;
        rr.segment_ids = ids;
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;

                env.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY;
                env.reclaim_reply = &rr;
                packet(4, &env);
        }
        fclose(out);

        /* An operator's tool: reload, metrics, and a name that is not UTF-8 on a second client. */
        begin(dir, "reload-metrics-names");
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
                Gpupool__Hello h = GPUPOOL__HELLO__INIT;
                Gpupool__ReloadRequest rl = GPUPOOL__RELOAD_REQUEST__INIT;
                Gpupool__MetricsRequest mr = GPUPOOL__METRICS_REQUEST__INIT;

                h.name = "gpupoolctl";
                h.has_admin = h.admin = 1;
                env.id = 1;
                env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
                env.hello = &h;
                packet(0, &env);
                simple(2, GPUPOOL__ENVELOPE__BODY_RELOAD, &rl);
                simple(3, GPUPOOL__ENVELOPE__BODY_METRICS, &mr);
                h.name = "bad-\xff";
                h.has_admin = h.admin = 0;
                packet(2, &env);
        }
        fclose(out);

        /* A process carving its own blocks: leases, returns and reclaim answers, with usage reports. */
        begin(dir, "lease-return-reclaim");
        hello(0);
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
                Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
                Gpupool__ReturnRequest ret = GPUPOOL__RETURN_REQUEST__INIT;
                Gpupool__Usage u = GPUPOOL__USAGE__INIT, *up = &u;

                lr.size = 3 << 20;
                env.id = 2;
                env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
                env.lease = &lr;
                packet(0, &env);
                lr.size = 4096;
                env.id = 3;
                packet(0, &env);
                u.in_use_bytes = 4096;
                u.held_free_bytes = 20 << 20;
                env.n_usage = 1;
                env.usage = &up;
                ret.n_segment_ids = 1;
                ret.segment_ids = ids;
                env.id = 4;
                env.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
                env.return_segments = &ret;
                packet(0, &env);
        }
        hello(1);
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
                Gpupool__Usage u = GPUPOOL__USAGE__INIT, *up = &u;
                uint64_t second = seg + 1;

                rr.n_segment_ids = 1;
                rr.segment_ids = &second;
                env.n_usage = 1;
                env.usage = &up;
                env.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY;
                env.reclaim_reply = &rr;
                packet(4, &env);
                {
                        Gpupool__UsageReport ur = GPUPOOL__USAGE_REPORT__INIT;

                        u.held_free_bytes = 2 << 20;
                        env.body_case = GPUPOOL__ENVELOPE__BODY_USAGE_REPORT;
                        env.usage_report = &ur;
                        packet(4, &env);        /* on the control channel */
                        packet(0, &env);        /* on the main connection: refused */
                }
        }
        fclose(out);

        /* An operator's reservations: put, the same again, by token, listed, deleted; a client presenting a token. */
        begin(dir, "reservations");
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
                Gpupool__Hello h = GPUPOOL__HELLO__INIT;
                Gpupool__ReservationPutRequest rp = GPUPOOL__RESERVATION_PUT_REQUEST__INIT;
                Gpupool__ReservationDeleteRequest rd = GPUPOOL__RESERVATION_DELETE_REQUEST__INIT;
                Gpupool__ReservationsRequest rl = GPUPOOL__RESERVATIONS_REQUEST__INIT;
                char *pods[] = { "0c1f2e3d-4b5a-6978-8a9b-acbdcedf0f1e" };

                hello(0);
                rp.key = rd.key = "job-a";
                rp.has_device = 1;
                rp.guarantee_bytes = 4u << 20;
                rp.has_limit_bytes = 1;
                rp.limit_bytes = 8u << 20;
                rp.n_pod_uids = 1;
                rp.pod_uids = pods;
                simple(2, GPUPOOL__ENVELOPE__BODY_RESERVATION_PUT, &rp);
                simple(3, GPUPOOL__ENVELOPE__BODY_RESERVATION_PUT, &rp);
                rp.key = "job-t";
                rp.n_pod_uids = 0;
                rp.token = "tok-0123456789abcdef";
                simple(4, GPUPOOL__ENVELOPE__BODY_RESERVATION_PUT, &rp);
                simple(5, GPUPOOL__ENVELOPE__BODY_RESERVATIONS, &rl);
                simple(6, GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST, &st);
                simple(7, GPUPOOL__ENVELOPE__BODY_RESERVATION_DELETE, &rd);
                h.name = "with-token";
                h.reservation = "tok-0123456789abcdef";
                env.id = 1;
                env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
                env.hello = &h;
                packet(2, &env);
        }
        fclose(out);

        begin(dir, "out-of-order");
        lease(1, 4096);         /* before hello */
        fclose(out);
        return 0;
}
