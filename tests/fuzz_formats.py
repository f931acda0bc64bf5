"""Seeded byte-flip fuzzing of Arrow IPC files and saved ``datasets`` folders, run as a child process by the tests.

``python tests/fuzz_formats.py KIND SEED COUNT FOLDER`` writes a good input of
KIND (``arrow``, ``arrow-stream`` or ``dataset``) in FOLDER, then COUNT copies
each with one byte changed (position and value drawn from SEED), and reads each
with `streambatch.prepare.iter_files`, the path ``prepare`` takes.  A copy
must read as documents or fail with a `StreamBatchError` naming it; any other
exception prints ``TRACEBACK`` and the child exits 1.  A crash (a segfault)
kills the child, which the test sees as a negative exit status: the line
``FILE n`` printed before each read names the copy that did it.  The last line
is ``DONE read=R refused=F``.
"""

from __future__ import annotations

import faulthandler
import random
import shutil
import sys
import traceback
from pathlib import Path

ROWS = 40


def _table() -> object:
    import pyarrow as pa

    return pa.table(
        {
            "id": [f"d{i}" for i in range(ROWS)],
            "text": [f"hello world {i} " * (i % 5 + 1) for i in range(ROWS)],
            "tokens": [list(range(i % 7 + 1)) for i in range(ROWS)],
            "partition": ["train" if i % 3 else "test" for i in range(ROWS)],
        }
    )


def write_good(kind: str, target: Path) -> Path:
    """A good input of *kind* at *target* (a file, or a folder for ``dataset``)."""
    import pyarrow as pa

    table = _table()
    if kind == "dataset":
        import datasets

        datasets.Dataset(table).save_to_disk(str(target))  # type: ignore[arg-type]
        return target
    with pa.OSFile(str(target), "wb") as sink:
        new = pa.ipc.new_stream if kind == "arrow-stream" else pa.ipc.new_file
        with new(sink, table.schema) as writer:  # type: ignore[attr-defined]
            for batch in table.to_batches(max_chunksize=10):  # type: ignore[attr-defined]
                writer.write_batch(batch)
    return target


def mutate(good: Path, copy: Path, rng: random.Random) -> str:
    """*good* copied to *copy* with one byte changed; returns what was changed."""
    if good.is_dir():
        shutil.copytree(good, copy)
        files = sorted(p for p in copy.iterdir() if p.is_file())
        weights = [4 if p.suffix == ".arrow" else 1 for p in files]
        victim = rng.choices(files, weights)[0]
    else:
        shutil.copyfile(good, copy)
        victim = copy
    data = bytearray(victim.read_bytes())
    at = rng.randrange(len(data))
    data[at] = rng.choice([rng.randrange(256), data[at] ^ 0x80, 0, 0xFF])
    victim.write_bytes(bytes(data))
    return f"{victim.name}@{at}"


def main(kind: str, seed: int, count: int, folder: Path) -> int:
    faulthandler.enable()
    from streambatch.errors import StreamBatchError
    from streambatch.prepare import iter_files

    suffix = "" if kind == "dataset" else ".arrow"
    good = write_good(kind, folder / f"good{suffix}")
    assert sum(1 for _ in iter_files([good])) == ROWS
    rng = random.Random(seed)
    read = refused = 0
    for n in range(count):
        copy = folder / f"copy-{n}{suffix}"
        changed = mutate(good, copy, rng)
        print(f"FILE {n} {changed}", flush=True)
        try:
            for _ in iter_files([copy], column="text" if n % 2 else None):
                pass
            read += 1
        except StreamBatchError as err:
            if str(copy) not in str(err):
                print(f"UNNAMED {n}: {err}", flush=True)
                return 1
            refused += 1
        except BaseException:
            print(f"TRACEBACK {n} {changed}", flush=True)
            traceback.print_exc(file=sys.stdout)
            return 1
        if copy.is_dir():
            shutil.rmtree(copy)
        else:
            copy.unlink()
    print(f"DONE read={read} refused={refused}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])))
