/*
 * request.h: what the daemon does with each request: one handler per message kind, each
 * turning a checked request into a packed reply. A table of the kinds (request.c) says who
 * may send each (operators only, control channels only, or never them, and what an
 * operator's connection past the limits may ask); request_serve() checks that in one place,
 * before the handler.
 */
#ifndef GP_REQUEST_H
#define GP_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reply.h"
#include "reservations.h"
#include "wire.h"

struct node;
struct session;

/* The most segments one ReturnRequest names. */
#define REQUEST_MAX_RETURNS 256

/*
 * Serves one request of session (the node's request hook): checks who may send it, handles
 * it, and replies, parks the session, or ends it; then what follows a change
 * (node_after_change()). The session may be gone when it returns.
 */
void request_serve(struct session *session, const Gpupool__Envelope *req);

/*
 * Tries the parked allocations again (memory came back, or their time is up: then they fail
 * for good, saying what was tried). Returns the earliest deadline left (loop clock, ms), or
 * UINT64_MAX with none parked.
 */
uint64_t request_retry_parked(struct node *node, uint64_t now_ms);

/* The requests that hand a client memory (request_lease.c): a lease, an adoption, a charge of memory outside the pool. */
void request_lease(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_adopt(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_charge(struct session *session, const Gpupool__Envelope *req, struct reply *ret);

/* Named objects (request_objects.c). */
void request_publish(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_attach(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_detach(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_unpublish(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_objects(struct session *session, const Gpupool__Envelope *req, struct reply *ret);

/* The operators' requests (request_admin.c). */
void request_status(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_flush(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_set_limit(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_trim(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_check(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_metrics(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_reload(struct session *session, const Gpupool__Envelope *req, struct reply *ret);

/* Reservations (request_reservations.c): put, delete, list. */
void request_reservation_put(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_reservation_delete(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_reservations(struct session *session, const Gpupool__Envelope *req, struct reply *ret);

/*
 * A client's hello presents token ($GPUPOOL_RESERVATION): 0 where the reservation that has it
 * is its pod's (bound now if no pod had presented it), else -EACCES (or -EIO) with why: no
 * such token, a process in no pod, a token another pod holds (logged, both pods named), a pod
 * with another reservation.
 */
int request_reservation_present(struct session *session, const char *token, char *why, size_t why_size);

/*
 * The node's reservations as a status to asking says them (its own client not counted), into
 * out (RESERVATIONS_MAX of them), their pods' UIDs pointed at from pods; *ret_n says how many.
 */
void request_reservations_status(struct session *asking, Gpupool__ReservationStatus *out,
                                 char *(*pods)[RESERVATION_PODS_MAX], size_t *ret_n);

#endif
