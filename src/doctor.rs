//! `hongbao doctor`: report this machine's limits for N connections and, as root, raise the
//! sysctls that fall short.

use anyhow::Result;
use clap::Args;
use hongbao_sys::doctor;

#[derive(Args)]
pub struct DoctorArgs {
    /// Connections to plan for
    #[arg(long, default_value_t = 1_000_000)]
    connections: u64,
    /// Write the sysctls that need changing (as root)
    #[arg(long)]
    apply: bool,
}

pub fn run(args: DoctorArgs) -> Result<()> {
    let DoctorArgs { connections, apply } = args;
    let limits = doctor::Limits::read();
    print!("{}", doctor::report(&limits, connections));
    if apply {
        for line in doctor::apply(&limits, connections) {
            println!("{line}");
        }
        print!("{}", doctor::report(&doctor::Limits::read(), connections));
    }
    Ok(())
}
