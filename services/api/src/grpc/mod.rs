//! The gRPC service implementations.

pub mod group;
pub mod inbox;
pub mod message;
