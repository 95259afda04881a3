//! `coordinatorctl`: Fleetmend's operator CLI (PKI, machines, …). See `coordinator::ctl`.

use std::process::ExitCode;

use coordinator::ctl::{parse, run};

fn main() -> ExitCode {
    protocol::telemetry::quiet_broken_pipe();
    let cli = parse();
    if let Err(e) = protocol::telemetry::init("warn") {
        eprintln!("coordinatorctl: {e}");
        return ExitCode::from(64);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("coordinatorctl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "coordinatorctl: {}",
                coordinator::ctl::common::error_line(&e)
            );
            ExitCode::FAILURE
        }
    }
}
