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

static void hello(uint64_t keep, uint64_t control_for) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__Hello h = GPUPOOL__HELLO__INIT;

        h.name = "seed";
        h.has_keep_free_bytes = keep != 0;
        h.keep_free_bytes = keep;
        h.has_control_for = control_for != 0;
        h.control_for = control_for;
        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = &h;
        packet(control_for ? 2 | 4 : 0, &env);
}

static void alloc(uint64_t id, uint64_t size) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__AllocRequest a = GPUPOOL__ALLOC_REQUEST__INIT;

        a.size = size;
        env.id = id;
        env.body_case = GPUPOOL__ENVELOPE__BODY_ALLOC;
        env.alloc = &a;
        packet(0, &env);
}

static void free_block(uint64_t id, uint64_t segment, uint64_t offset) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__FreeRequest f = GPUPOOL__FREE_REQUEST__INIT;

        f.segment_id = segment;
        f.offset = offset;
        env.id = id;
        env.body_case = GPUPOOL__ENVELOPE__BODY_FREE;
        env.free = &f;
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
        Gpupool__ReleaseRequest rel = GPUPOOL__RELEASE_REQUEST__INIT;
        Gpupool__SetLimitRequest sl = GPUPOOL__SET_LIMIT_REQUEST__INIT;
        Gpupool__TrimRequest tr = GPUPOOL__TRIM_REQUEST__INIT;
        Gpupool__CheckRequest ck = GPUPOOL__CHECK_REQUEST__INIT;
        Gpupool__ReclaimReply rr = GPUPOOL__RECLAIM_REPLY__INIT;
        uint64_t seg = (0ULL << 56) | 1, ids[1] = { seg };

        /* The daemon's first segment id on device 0 is 1: frees and releases of it are valid. */
        begin(dir, "alloc-free-release-bye");
        hello(0, 0);
        alloc(2, 4096);
        alloc(3, 100000);
        free_block(4, seg, 0);
        free_block(5, seg, 4096);
        rel.segment_id = seg;
        simple(6, GPUPOOL__ENVELOPE__BODY_RELEASE, &rel);
        simple(7, GPUPOOL__ENVELOPE__BODY_BYE, &bye);
        fclose(out);

        begin(dir, "status-flush-check");
        hello(0, 0);
        alloc(2, 12u << 20);
        simple(3, GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST, &st);
        fl.has_device = 1;
        simple(4, GPUPOOL__ENVELOPE__BODY_FLUSH, &fl);
        simple(5, GPUPOOL__ENVELOPE__BODY_CHECK, &ck);
        fclose(out);

        begin(dir, "limits-and-trim");
        hello(0, 0);
        sl.tenant = "default";
        sl.has_max_bytes = 1;
        sl.max_bytes = 8u << 20;
        simple(2, GPUPOOL__ENVELOPE__BODY_SET_LIMIT, &sl);
        alloc(3, 10u << 20);
        tr.tenant = "default";
        simple(4, GPUPOOL__ENVELOPE__BODY_TRIM, &tr);
        fl.tenant = "default";
        simple(5, GPUPOOL__ENVELOPE__BODY_FLUSH, &fl);
        fclose(out);

        begin(dir, "keep-and-control");
        hello(24u << 20, 0);
        alloc(2, 65536);
        free_block(3, seg, 0);
        hello(0, 1);            /* the second client: control channel of client 1 */
        rr.n_segment_ids = 1;
        rr.segment_ids = ids;
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;

                env.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY;
                env.reclaim_reply = &rr;
                packet(4, &env);
        }
        fclose(out);

        begin(dir, "free-batch");
        hello(0, 0);
        alloc(2, 4096);
        alloc(3, 8192);
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
                Gpupool__FreeBatchRequest fb = GPUPOOL__FREE_BATCH_REQUEST__INIT;
                Gpupool__FreeRequest f1 = GPUPOOL__FREE_REQUEST__INIT, f2 = GPUPOOL__FREE_REQUEST__INIT;
                Gpupool__FreeRequest *fs[2] = { &f1, &f2 };

                f1.segment_id = f2.segment_id = seg;
                f2.offset = 4096;
                fb.n_frees = 2;
                fb.frees = fs;
                fb.n_release_segment_ids = 1;
                fb.release_segment_ids = ids;
                env.id = 4;
                env.body_case = GPUPOOL__ENVELOPE__BODY_FREE_BATCH;
                env.free_batch = &fb;
                packet(0, &env);
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
        hello(0, 0);
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
        hello(0, 1);
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

        begin(dir, "out-of-order");
        alloc(1, 4096);         /* before hello */
        fclose(out);
        return 0;
}
