//! The Notify gRPC contract (`notify.v1`), compiled once here for every crate.

#![allow(missing_docs, clippy::all, unused_qualifications)]

/// Generated types and service stubs of package `notify.v1`.
pub mod v1 {
    tonic::include_proto!("notify.v1");
}

/// Encoded file descriptor set of `notify.v1`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("notify_descriptor");
