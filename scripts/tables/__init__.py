"""The docs tables that no single benchmark owns: the README's headline (one figure per part,
read through each benchmark's record) and the RL presets (read from the code that defines
them). Every other table is declared beside its benchmark's record, in
:mod:`benchmarks.records`."""
