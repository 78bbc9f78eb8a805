//! Compiles `notify/v1/*.proto` with a vendored `protoc`, so a clean checkout
//! builds without a system protobuf compiler.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY-free: build scripts are single threaded, setting the variable only
    // tells prost-build where the vendored compiler lives.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts run single-threaded; nothing reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "notify/v1/common.proto",
        "notify/v1/message.proto",
        "notify/v1/inbox.proto",
        "notify/v1/group.proto",
        "notify/v1/admin.proto",
        "notify/v1/events.proto",
    ];
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("notify_descriptor.bin"))
        .compile_protos(&protos, &["."])?;
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
