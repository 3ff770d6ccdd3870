//! C callback adapters: caller-implemented vtables adapted to the library's traits.

pub mod engine;
