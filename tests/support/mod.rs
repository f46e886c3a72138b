pub mod agent;
pub mod tempdir;
