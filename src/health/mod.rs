//! Health: what an exchange's outcome says about its upstream.

pub mod classify;

pub use classify::Outcome;
