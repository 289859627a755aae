"""The operator's side of gpupoold's protocol (proto/gpupool.proto, docs/protocol.md), for the
kubelet's plugins: status, and the reservations put, deleted and listed. One connection per
call: a daemon that restarted between two calls is no error, and one that is down says so.
"""
import os
import socket

import gpupool_pb2 as pb

PROTOCOL_VERSION = 2
MAX_REPLY_BYTES = 192 * 1024            # GP_MAX_REPLY_BYTES (common/wire.h)
DEFAULT_SOCKET = "/run/gpupool/gpupool.sock"


class DaemonError(Exception):
    """gpupoold refused (status is its Status name) or could not be reached (status None)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class Daemon:
    def __init__(self, path=None, name="gpupool-kubelet", timeout=10.0):
        self.path = path or os.environ.get("GPUPOOL_SOCKET") or DEFAULT_SOCKET
        self.name = name
        self.timeout = timeout

    def _exchange(self, sock, env):
        env.version = PROTOCOL_VERSION
        sock.send(env.SerializeToString())
        data = sock.recv(MAX_REPLY_BYTES + 1)
        if not data:
            raise DaemonError("gpupoold at %s closed the connection" % self.path)
        rep = pb.Envelope()
        rep.ParseFromString(data)
        if rep.HasField("status") and rep.status != pb.STATUS_OK:
            raise DaemonError(rep.error or pb.Status.Name(rep.status), pb.Status.Name(rep.status))
        return rep

    def call(self, **body):
        """Sends one request (its body as the Envelope's field=message), returns the reply Envelope."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            try:
                sock.connect(self.path)
            except OSError as e:
                raise DaemonError("cannot reach gpupoold at %s: %s" % (self.path, e.strerror or e)) from None
            hello = pb.Envelope(id=1, hello=pb.Hello(name=self.name, admin=True))
            self._exchange(sock, hello)
            req = pb.Envelope(id=2, **body)
            return self._exchange(sock, req)
        except socket.timeout:
            raise DaemonError("gpupoold at %s did not answer within %g s" % (self.path, self.timeout)) from None
        except OSError as e:
            raise DaemonError("gpupoold at %s: %s" % (self.path, e.strerror or e)) from None
        finally:
            sock.close()

    def status(self):
        return self.call(status_request=pb.StatusRequest()).status_reply

    def reservations(self):
        return list(self.call(reservations=pb.ReservationsRequest()).reservations_reply.reservations)

    def put(self, key, generation, guarantee_bytes, limit_bytes=None, device=None, device_uuid=None, pods=(), token=None):
        req = pb.ReservationPutRequest(key=key, generation=generation, guarantee_bytes=guarantee_bytes)
        if limit_bytes is not None:
            req.limit_bytes = limit_bytes
        if device_uuid:
            req.device_uuid = device_uuid
        else:
            req.device = device
        req.pod_uids.extend(pods)
        if token:
            req.token = token
        return self.call(reservation_put=req).reservation_put_reply

    def flush_tenant(self, tenant, device):
        """Asks tenant's clients for the segments they keep free on device (ladder step 3): they go to the backend."""
        return self.call(flush=pb.FlushRequest(tenant=tenant, device=device)).flush_reply

    def delete(self, key):
        return self.call(reservation_delete=pb.ReservationDeleteRequest(key=key)).reservation_delete_reply.deleted
