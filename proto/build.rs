//! Compiles `notify/v1/*.proto` with a vendored `protoc`, so a clean checkout
//! builds without a system protobuf compiler.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "notify/v1/common.proto",
        "notify/v1/message.proto",
        "notify/v1/inbox.proto",
        "notify/v1/group.proto",
        "notify/v1/admin.proto",
        "notify/v1/events.proto",
    ];
    // The compiler is handed to prost-build in its config rather than through
    // the `PROTOC` variable, which only `unsafe` code could set here.
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // A recipient's vars are decoded a million times in a large send and
    // stored as a JSON object in key order: decoded straight into that order.
    config.btree_map([".notify.v1.RecipientVars.vars"]);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("notify_descriptor.bin"))
        .compile_with_config(config, &protos, &["."])?;
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
