//! agent: wires config, store, sources, sync loop and runtime together for `holdfast run`.
