//! sync: the sync loop, pod workers, restart back-off, pod phase and conditions. Never talks HTTP.
