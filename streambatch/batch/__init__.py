"""The one batch model every item kind makes, and the raw sums a batch is reduced to.

- ``minibatch``: `MiniBatch` (inputs, targets, provenance, optional packed and mixture columns);
- ``span``: the token spans a batch's rows read;
- ``sums``, ``reduce``: raw sums (`TokenSums`, `TokenContribution`), their fold (`token_mean`,
  `TokenMeanAccumulator`) and the one division (`TokenMean`). A batch averages its own
  contributions, so the fold sits here, below the kinds and the stages.
"""
