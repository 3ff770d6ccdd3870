//! The store-facing protocol: loading manifests and executing restores
//! (`load-path.md`), and (with the snapshot path) payload operations and the upload
//! transaction. Keys always come from plans; nothing here builds keys by hand.

pub mod load;
