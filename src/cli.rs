//! cli: the `holdfast` subcommands other than `run` (pods, image, version).
