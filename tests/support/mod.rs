pub mod agent;
pub mod cni;
pub mod tempdir;
