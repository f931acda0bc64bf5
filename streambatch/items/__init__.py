"""The item kinds behind one protocol: what the ordering stages order and `materialize` gathers.

`streambatch.items.protocol.Items` is the seam: sized, sliceable, a ``view(lo, hi,
batch_index=)`` per chunk, and each kind's own ``gather(index)`` and
``gather_batches(batch_size, batches)`` into the one `streambatch.MiniBatch`.
``chunk``, ``share``, ``materialize``, ``Epoch``, ``Run``, the torch datasets, the
audit and the figures never ask which kind they hold.

- ``windows/``: `Windows`, every complete window of one source (``sb.windows``), and their row gathers.
- ``pack/``: packed `Rows`, whole pieces of documents packed best-fit into rows (``sb.pack``).
- ``mix/``: a `Mixture`, several sources' windows or packed rows at exact weights (``sb.mix``).
"""
