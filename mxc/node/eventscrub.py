"""Keep the secrets a spec passes to the training (``env.pass``) out of the run's files.

MaxText writes its whole configuration into the TensorBoard event file as text summaries
(``maxtext_utils.add_config_to_summary_writer``), ``hf_access_token`` included, which it reads from
``HF_TOKEN`` (``pyconfig._resolve_or_infer_addl_config``, MaxText 0.2.5); the event file is
world-readable and ``mxc dashboard`` serves it. MaxText has no option that leaves one key out of that
dump, so the node program masks the secret where it lands:

* **event files** (:class:`EventScrubber`): every complete record of every ``*tfevents*`` file under
  the run's TensorBoard directory is searched for each secret in every form ``secret_forms`` knows;
  a hit is overwritten in place by as many ``*`` (the record keeps its length, so protobuf and
  TFRecord framing stay valid) and the record's CRC-32C is written anew. It runs while the trainer
  runs (each look of the train stage, reading only what was appended since) and once after it: the
  writer appends through its own file offset, which writes at earlier offsets do not move;
* **the trainer's output** (:func:`line_redactor`): each line that holds a secret has it replaced by
  ``***`` before it reaches the log.

Stdlib only (the node program).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from .envmerge import may_be_secret
from .secret_forms import REDACTED, Redactor
from .secretscan import secret_shape

HEADER = 12  # u64 length, u32 masked CRC-32C of the length
FOOTER = 4  # u32 masked CRC-32C of the data


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's stored form of a CRC (tensorflow/core/lib/hash/crc32c.h ``Mask``)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def passed_secrets(env: Mapping[str, str], passed: Sequence[str]) -> list[str]:
    """The values of the passed variables that are secrets: by their name (HF_TOKEN, WANDB_API_KEY) or shape."""
    return [env[name] for name in passed if env.get(name) and (may_be_secret(name) or secret_shape(env[name]))]


def _masker(secrets: Iterable[str]) -> Callable[[bytes], bytes]:
    redactors = [r for r in (Redactor(s) for s in secrets) if r.pattern is not None]

    def mask(data: bytes) -> bytes:
        text = data.decode("latin-1")  # one character per byte: the length stays
        for redactor in redactors:
            assert redactor.pattern is not None
            if redactor.pattern.search(text):
                text = redactor.mask(text)
        return text.encode("latin-1")

    return mask


def line_redactor(secrets: Iterable[str]) -> Callable[[bytes], bytes] | None:
    """For the trainer's output: each line with every form of each secret replaced by ***."""
    redactors = [r for r in (Redactor(s) for s in secrets) if r.pattern is not None]
    if not redactors:
        return None

    def redact(line: bytes) -> bytes:
        text = line.decode("latin-1")
        for redactor in redactors:
            assert redactor.pattern is not None
            text = redactor.pattern.sub(REDACTED, text)
        return text.encode("latin-1")

    return redact


class EventScrubber:
    """Masks ``secrets`` in the TensorBoard event files under ``root``, each record once."""

    def __init__(self, root: Path, secrets: Iterable[str]) -> None:
        self.root = root
        self.mask = _masker(secrets)
        self.done: dict[str, int] = {}  # file -> offset after its last complete record looked at
        self.masked = 0  # records rewritten

    def scan(self) -> int:
        """Look at what was appended to each event file since the last look; the records masked now."""
        before = self.masked
        if self.root.is_dir():
            for path in sorted(self.root.rglob("*tfevents*")):
                if path.is_file() and not path.is_symlink():
                    self._scan(path)
        return self.masked - before

    def _scan(self, path: Path) -> None:
        start = self.done.get(str(path), 0)
        try:
            size = path.stat().st_size
            if size <= start:
                return
            fd = os.open(str(path), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            data = os.pread(fd, size - start, start)
            offset = 0
            while offset + HEADER <= len(data):
                (length,) = struct.unpack_from("<Q", data, offset)
                end = offset + HEADER + length + FOOTER
                if end > len(data):
                    break  # still being written
                body = data[offset + HEADER:offset + HEADER + length]
                masked = self.mask(body)
                if masked != body:
                    os.pwrite(fd, masked + struct.pack("<I", masked_crc(masked)), start + offset + HEADER)
                    self.masked += 1
                offset = end
            self.done[str(path)] = start + offset
        except OSError:
            pass
        finally:
            os.close(fd)
