"""One checkpoint in ``torch.distributed.checkpoint`` (DCP) format, written by every rank on its
own and joined into one by a single rank: no collective of torch's runs, so the writes can go on
in a background thread while training uses the ftcomm communicator.

DCP's own ``save`` plans collectively (a gather of every rank's plan to a coordinator, then a
gather of the write results). Here every rank knows its part beforehand, so each one runs DCP's
``save`` alone (``no_dist=True``) with two extensions through DCP's public planner and storage
interfaces:

- ``_PartPlanner`` writes exactly this rank's entries: a whole tensor (``Whole``), a slice of a
  1-D tensor that several ranks share (``Piece``: a DCP chunk with its global offset, as a
  sharded tensor's shard is), or any picklable object (``Blob``);
- ``_PartWriter`` names its data files ``__{rank}_{n}.distcp`` (DCP's own naming) and, instead of
  the checkpoint's ``.metadata``, leaves this rank's plan and write results in ``__{rank}.part``.

Once every rank's part is on disk (the caller agrees on that), one rank calls ``join_parts``: it
merges the parts' metadata (the chunks of each shared tensor, the file offsets of every item) and
writes the one ``.metadata`` DCP readers look for. The directory is then an ordinary DCP
checkpoint: ``torch.distributed.checkpoint.load``, ``format_utils.dcp_to_torch_save`` and any
other DCP reader take it, at any world size. ``read`` loads what one rank needs: whole tensors,
objects, and slices of shared tensors (re-sharding: a slice may span several writers' chunks).

Silent corruption at rest: every data file's XXH3-64 is taken while it is written (``_Digests``:
no second pass over the bytes) and kept in ``ftcomm.checksums`` beside ``.metadata`` (torch's
readers ignore it); ``verify`` checks files against it.

DCP reports its I/O errors as ``CheckpointException``, a ``BaseException`` that ``except
Exception`` misses; every function here raises ``CheckpointIOError`` (an ``OSError``) instead.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint import CheckpointException, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.default_planner import (DefaultLoadPlanner, DefaultSavePlanner,
                                                          create_default_local_load_plan)
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadPlan, SavePlan, TensorWriteData, WriteItem,
                                                  WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.utils.serialization import config as serialization_config

METADATA = ".metadata"  # DCP's name for a checkpoint's index
CHECKSUMS = "ftcomm.checksums"  # {data file: XXH3-64 hex digest}, written by join_parts


class CheckpointIOError(OSError):
    """A checkpoint could not be written or read (DCP's ``CheckpointException``, or a file whose
    checksum is wrong), naming the directory and the cause."""


@contextmanager
def _as_os_errors(what: str):
    try:
        yield
    except CheckpointException as exc:
        causes = "; ".join(f"{type(e).__name__}: {e}" for e in getattr(exc, "failures", {}).values()) or str(exc)
        raise CheckpointIOError(f"{what}: {causes}") from None


@dataclass
class Whole:
    """A tensor this rank writes whole (nobody else writes it); host memory, contiguous."""

    tensor: torch.Tensor


@dataclass
class Piece:
    """Elements ``[offset, offset + len(tensor))`` of a 1-D tensor of ``global_len`` elements whose
    other pieces other ranks write (a ZeRO shard of a flat optimizer-state vector)."""

    tensor: torch.Tensor
    offset: int
    global_len: int


@dataclass
class Blob:
    """Any picklable object (a scheduler's state dict, the data position), stored as bytes."""

    value: object


def part_file(rank: int) -> str:
    return f"__{rank}.part"


@dataclass
class _Prefix:
    """What DCP's file writer reads from a plan's ``storage_data``: the data files' name prefix."""

    prefix: str


def _tensor_item(fqn: str, tensor: torch.Tensor, offsets: tuple, size: torch.Size, kind) -> WriteItem:
    chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=tensor.size())
    return WriteItem(index=MetadataIndex(fqn, list(offsets)), type=kind,
                     tensor_data=TensorWriteData(chunk=chunk, properties=TensorProperties.create_from_tensor(tensor),
                                                 size=size))


def _write_item(fqn: str, entry) -> WriteItem:
    if isinstance(entry, Whole):
        t = entry.tensor
        return _tensor_item(fqn, t, (0,) * t.dim(), t.size(), WriteItemType.TENSOR)
    if isinstance(entry, Piece):
        return _tensor_item(fqn, entry.tensor, (entry.offset,), torch.Size([entry.global_len]), WriteItemType.SHARD)
    return WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO)


class _PartPlanner(DefaultSavePlanner):
    """Plans the writes of this rank's entries only (DCP's default plans every tensor on every rank
    and lets the coordinator drop duplicates, which needs the collective planning step)."""

    def __init__(self, entries: dict):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.entries = entries

    def create_local_plan(self) -> SavePlan:
        self.plan = SavePlan([_write_item(fqn, e) for fqn, e in self.entries.items()])
        return self.plan

    def lookup_object(self, index: MetadataIndex):
        # A Piece is a plain tensor at a non-zero offset, which DCP's lookup takes for a sharded
        # tensor's shard; the state dict holds exactly what is to be written.
        return self.state_dict[index.fqn]


class _HashingStream:
    """A binary file being written, whose bytes also go through XXH3-64."""

    def __init__(self, raw, on_close):
        self.raw, self.on_close, self.hash = raw, on_close, xxhash.xxh3_64()

    def write(self, data) -> int:
        self.hash.update(data)
        return self.raw.write(data)

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.raw.closed:
            self.raw.close()
            self.on_close(self.hash.hexdigest())


class _Digests(FileSystem):
    """DCP's file system, keeping the XXH3-64 of every file written through it ({name: hex})."""

    def __init__(self):
        super().__init__()
        self.digests: dict[str, str] = {}

    @contextmanager
    def create_stream(self, path, mode: str):
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = os.path.basename(str(path))
        with open(path, mode) as raw:
            stream = _HashingStream(raw, lambda digest: self.digests.__setitem__(name, digest))
            try:
                yield stream
            finally:
                stream.close()


class _PartWriter(FileSystemWriter):
    """DCP's file writer, with this rank's file names and its share of the metadata in a part file
    (its data files' digests among it)."""

    def __init__(self, path: str, rank: int):
        super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=True)
        self.part_rank = rank
        self.fs = _Digests()

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(p, storage_data=_Prefix(f"__{self.part_rank}_")) for p in plans]

    def finish(self, metadata: Metadata, results) -> None:
        path = os.path.join(self.path, part_file(self.part_rank))
        with open(path + ".tmp", "wb") as f:
            pickle.dump({"metadata": metadata, "results": [r for rs in results for r in rs],
                         "digests": dict(self.fs.digests)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)


def write_part(directory: str, rank: int, entries: dict) -> int:
    """Writes ``entries`` ({fqn: Whole | Piece | Blob}) as rank ``rank``'s part of the checkpoint in
    ``directory`` (created if needed), every file fsynced. Runs no collective.

    Returns:
        Bytes written (data files and part file).

    Raises:
        OSError: the file system refused a write.
    """
    os.makedirs(directory, exist_ok=True)
    state = {fqn: (e.value if isinstance(e, Blob) else e.tensor) for fqn, e in entries.items()}
    # torch.save's zip CRC-32 of every record ran at 150-250 MB/s here, slower than the disk (it
    # made the writer 0.6x as fast as a plain write at 100M parameters); the data files' XXH3-64
    # digests, taken while writing and checked at resume, cover what it would. The setting is
    # process-wide while the write runs: a torch.save of the program's own at that moment is
    # written without CRC too (torch.load reads it all the same).
    with _as_os_errors(f"writing rank {rank}'s part of {directory}"), \
            serialization_config.patch({"save.compute_crc32": False}):
        dcp.save(state, storage_writer=_PartWriter(directory, rank), planner=_PartPlanner(entries), no_dist=True)
    prefix = f"__{rank}_"
    return sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)
               if name.startswith(prefix) or name == part_file(rank))


def join_parts(directory: str, ranks: int) -> None:
    """Merges the part files of ranks ``0 .. ranks-1`` into the checkpoint's ``.metadata`` (the
    chunks of a shared tensor from every writer; every item's file and offset), fsynced.

    Raises:
        OSError: a part file is missing or unreadable.
        ValueError: two parts describe one tensor differently (they come from different runs).
    """
    tensors, others, results, digests = {}, {}, [], {}
    for rank in range(ranks):
        try:
            with open(os.path.join(directory, part_file(rank)), "rb") as f:
                part = pickle.load(f)
        except (EOFError, pickle.UnpicklingError) as exc:
            raise CheckpointIOError(f"{directory}: rank {rank}'s part file is damaged: {exc}") from None
        results.append(part["results"])
        digests.update(part.get("digests", {}))
        for fqn, md in part["metadata"].state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                others[fqn] = md
                continue
            have = tensors.setdefault(fqn, TensorStorageMetadata(md.properties, md.size, []))
            if have.size != md.size or have.properties.dtype != md.properties.dtype:
                raise ValueError(f"checkpoint {directory}: rank {rank}'s part describes {fqn} as "
                                 f"{md.properties.dtype} {tuple(md.size)}, another's as "
                                 f"{have.properties.dtype} {tuple(have.size)}")
            have.chunks.extend(md.chunks)
    _write_synced(os.path.join(directory, CHECKSUMS), json.dumps(digests, sort_keys=True).encode())
    items = {**tensors, **others}
    FileSystemWriter(directory, sync_files=True).finish(Metadata(items, planner_data=nesting(items)), results)
    for rank in range(ranks):
        os.unlink(os.path.join(directory, part_file(rank)))


def nesting(names) -> dict[str, tuple[str, ...]]:
    """DCP's ``planner_data``: where each flat name sits in the nested state dict that torch's
    tools (``format_utils.dcp_to_torch_save``, ``dcp.load`` with no state dict) rebuild. The
    first dotted component is the group ("model", "optim", "extra", "rng", "loader"), the rest
    the name inside it: "model.0.weight" -> ("model", "0.weight"), as DCP's own flattening of
    ``{"model": model.state_dict()}`` names it."""
    return {name: tuple(name.split(".", 1)) for name in names}


def _write_synced(path: str, data: bytes) -> None:
    with open(path + ".tmp", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def data_files(directory: str) -> dict[str, str] | None:
    """{data file: expected XXH3-64 hex digest} of a joined checkpoint; None when it has no record
    of them (written by another tool)."""
    try:
        with open(os.path.join(directory, CHECKSUMS)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckpointIOError(f"{directory}: its checksum record is unreadable: {exc}") from None


def verify(directory: str, names) -> None:
    """Reads the data files ``names`` of a joined checkpoint whole and checks each against its
    recorded XXH3-64.

    Raises:
        CheckpointIOError: a file is missing, unreadable, or its digest differs (naming it).
    """
    expected = data_files(directory) or {}
    for name in names:
        h = xxhash.xxh3_64()
        try:
            with open(os.path.join(directory, name), "rb") as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
        except OSError as exc:
            raise CheckpointIOError(f"{directory}/{name}: {exc}") from None
        if h.hexdigest() != expected.get(name):
            raise CheckpointIOError(f"{directory}/{name}: checksum {h.hexdigest()}, recorded "
                                    f"{expected.get(name)}: the file changed after it was written")


def is_complete(directory: str) -> bool:
    """True when ``directory`` holds a joined checkpoint (its ``.metadata``)."""
    return os.path.exists(os.path.join(directory, METADATA))


class _SliceLoader(DefaultLoadPlanner):
    """Loads whole tensors and objects as DCP does, and for ``slices`` ({fqn: (lo, hi)}) only
    elements [lo, hi) of a 1-D tensor, from whichever chunks hold them."""

    def __init__(self, slices: dict):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.slices = slices

    def create_local_plan(self) -> LoadPlan:
        whole = {k: v for k, v in self.state_dict.items() if k not in self.slices}
        items = create_default_local_load_plan(whole, self.metadata, True).items
        for fqn, (lo, hi) in self.slices.items():
            if hi <= lo:
                continue
            chunk = ChunkStorageMetadata(offsets=torch.Size([lo]), sizes=torch.Size([hi - lo]))
            items += create_read_items_for_chunk_list(fqn, self.metadata.state_dict_metadata[fqn], [chunk])
        return LoadPlan(items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[index.fqn]  # a slice's destination is a plain tensor, not a shard


def read_metadata(directory: str) -> Metadata:
    """The checkpoint's index: ``state_dict_metadata`` names every entry with its size.

    Raises:
        CheckpointIOError: it cannot be read.
    """
    try:
        return FileSystemReader(directory).read_metadata()
    except (OSError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointIOError(f"{directory}: its {METADATA} is unreadable: {exc}") from None


def read(directory: str, tensors: dict, slices: dict | None = None, objects: tuple = ()) -> dict:
    """Loads from a joined checkpoint, on one rank, without collectives.

    Args:
        tensors: {fqn: destination tensor}, filled in place (whole tensors, or for a name in
            ``slices`` a 1-D tensor of ``hi - lo`` elements).
        slices: {fqn: (lo, hi)}: load only elements [lo, hi) of that 1-D tensor.
        objects: names of ``Blob`` entries to load.

    Returns:
        {name: object} for ``objects``.

    Raises:
        CheckpointIOError: a file is missing or damaged, an entry missing or of another size.
    """
    state = dict(tensors)
    state.update({name: None for name in objects})
    with _as_os_errors(f"reading {directory}"):
        dcp.load(state, storage_reader=FileSystemReader(directory), planner=_SliceLoader(slices or {}),
                 no_dist=True)
    return {name: state[name] for name in objects}
