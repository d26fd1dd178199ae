"""Where an inner data-plane group meets: a TCPStore served by its communicator's rank 0, kept
from one group to the next while that rank stays rank 0, each group under a key prefix of its own.

An inner group is made anew after every recovery (``inner_group.py``). When the rank lost was not
rank 0 (the survivors keep their order, and a spare takes the lost rank's place), the new group
meets through the store the old one used, under a new prefix: no new server, no new connection.
A new store, on a free port, is made only when rank 0 itself changed (it was lost), or on a
rank that has none yet (a spare, the first group). The address, a random id of the store and the
prefix's number reach the other ranks by a broadcast over the communicator, so no key of an old
group (its abort key above all) can be mistaken for a new one's, and a new store that happens to
get the port of a dead one is not mistaken for it.

Why keep it: a new store costs a server and two connections per rank, and torch resolves the
name of every connection's address (a reverse DNS query per connect and per accept, torch 2.13 to
2.15). Where the resolver drops a query, that connect waits out glibc's 5 s resolver timeout:
measured on the test machines, about one connect in twelve. A recovery should not wait for DNS.

Each rank holds two clients of the store: one for the group's rendezvous and its abort key, and
one for ``abort_watch.py``'s looks (a client serialises its calls, and a look may hang on a
stopped server). The old groups' keys stay in a kept store: a few small keys per recovery.
"""
from __future__ import annotations

import json
import secrets
import socket

import numpy as np
import torch.distributed as dist

from .lifetime import deadline, release_in_background

_ADDRESS_BYTES = 512


class GroupStores:
    """This rank's side of the store its inner groups meet through (see the module).

    Attributes:
        stores_made: stores this rank connected to so far (1 + the times rank 0 changed).
    """

    def __init__(self):
        self._store = None        # the rendezvous client (on rank 0: also the server)
        self._watch_client = None  # the abort watch's own client
        self._store_id = None     # the random id rank 0 gave the store
        self._serves = False      # whether this rank's _store is the server
        self._groups = 0          # groups made in the store so far (rank 0 counts)
        self.stores_made = 0

    def for_group(self, comm, timeout: float, watch_timeout: float):
        """The stores a new inner group over ``comm`` uses: ``(store, watch_store)``, two views,
        under the group's own prefix, of the two clients of the store ``comm``'s rank 0 serves.
        Collective over ``comm`` (one broadcast). ``timeout``: seconds for the rendezvous client's
        calls; ``watch_timeout``: seconds for the watch client's.

        Raises:
            FtError: the broadcast failed (a rank of ``comm`` failed).
            RuntimeError: the store's server could not be reached.
        """
        address = np.zeros(_ADDRESS_BYTES, np.uint8)
        if comm.rank == 0:
            if not self._serves:
                self._serve(comm.size, timeout)
            self._groups += 1
            raw = json.dumps([self._store.host, self._store.port, self._store_id, self._groups]).encode()
            address[:len(raw)] = np.frombuffer(raw, np.uint8)
        comm.broadcast(address, root=0, timeout=timeout)
        host, port, store_id, group = json.loads(address.tobytes().rstrip(b"\0"))
        if comm.rank != 0 and store_id != self._store_id:
            self._connect(host, port, store_id, comm.size, timeout)
        self._store.set_timeout(deadline(timeout))  # this group's, not the one the store was made for
        if self._watch_client is None:
            # Connected under the rendezvous timeout (a connect may wait for a name lookup), then
            # held to the watch's own for its looks.
            self._watch_client = _client(host, port, comm.size, timeout)
            self._watch_client.set_timeout(deadline(watch_timeout))
        prefix = f"ftcomm/group{group}/"
        return dist.PrefixStore(prefix, self._store), dist.PrefixStore(prefix, self._watch_client)

    def _serve(self, size: int, timeout: float) -> None:
        self._drop()
        self._store = dist.TCPStore(socket.gethostname(), 0, size, True, timeout=deadline(timeout),
                                    wait_for_workers=False)
        self._store_id, self._serves, self._groups = secrets.token_hex(8), True, 0
        self.stores_made += 1

    def _connect(self, host: str, port: int, store_id: str, size: int, timeout: float) -> None:
        self._drop()
        self._store = _client(host, port, size, timeout)
        self._store_id, self._serves = store_id, False
        self.stores_made += 1

    def _drop(self) -> None:
        """Lets go of the old store's clients (its server is gone, or no longer rank 0's); a client
        of a stopped server may block while it closes (lifetime.py)."""
        old = [self._store, self._watch_client]
        self._store = self._watch_client = self._store_id = None
        self._serves = False
        release_in_background(old, "old-store")


def _client(host: str, port: int, size: int, timeout: float):
    return dist.TCPStore(host, port, size, False, timeout=deadline(timeout))

