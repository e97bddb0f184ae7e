"""The benchmarks of `benchmarks/BENCHMARKS.md`: the rows they compare (`rows`, read from the repository's configs/),
training speed and memory (`speed`, `layers`), preprocessing (`preprocess`), the data path (`data`), quality runs
with the paired bootstrap (`quality`) and the CPU recipe sweep (`recipes`). Their command lines are in scripts/.

Nothing of the model imports this package: a saved folder's code (what `trust_remote_code` copies) holds none of it.
"""
