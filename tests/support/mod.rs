pub mod agent;
pub mod cni;
pub mod maps;
pub mod tempdir;
