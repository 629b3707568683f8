//! `hongbao lab up` and `lab down`: bring a lab of network-namespace hosts up, print where
//! everything is and hold it until a signal; or clear away one left behind.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Args, Subcommand};
use hongbao_sys::Stop;

#[derive(Subcommand)]
pub enum LabCommand {
    /// Bring a lab up and hold it until Ctrl-C (or SIGTERM), then take it down.
    Up(LabUpArgs),
    /// Take down a lab left behind (its owner was killed): the processes it recorded in
    /// DIR/lab.json, its hosts and its bridge.
    Down {
        /// The lab's --dir
        #[arg(long, default_value = "lab")]
        dir: PathBuf,
    },
}

#[derive(Args)]
pub struct LabUpArgs {
    /// The lab's number n: its hosts are on 198.18.n.0/24
    #[arg(long, default_value_t = 1)]
    lab: u8,
    /// Logs, data and the state file
    #[arg(long, default_value = "lab")]
    dir: PathBuf,
    /// Gateway hosts (hongbao serve in cluster mode)
    #[arg(long, default_value_t = 2)]
    gateways: usize,
    /// Hosts for load generators (run them with `ip netns exec hbN-loadK hongbao load …`)
    #[arg(long, default_value_t = 1)]
    loads: usize,
    /// Worker processes per gateway
    #[arg(long, default_value = "2")]
    workers: String,
    /// No nginx in front of the gateways
    #[arg(long)]
    no_nginx: bool,
    /// The ledger a primary with a synchronous standby (hosts pg and pg2), failed over by
    /// pg_auto_failover's monitor (host pgmon); the gateways use a multi-host URL
    #[arg(long)]
    standby: bool,
    /// The ledger's shards: shard 0 is the lab's PostgreSQL, each other one a PostgreSQL
    /// of its own (hosts pgs1…); with --standby each a formation (at most 3: hosts pgsK,
    /// pgsKb and their monitor pgsKm); the gateways get every shard (docs/scale-out.md,
    /// "Shards")
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    shards: u16,
    /// The login secret of every gateway
    #[arg(long, env = "HONGBAO_SECRET", default_value = hongbao_server::config::DEV_SECRET)]
    secret: String,
}

pub fn run(command: LabCommand) -> Result<()> {
    match command {
        LabCommand::Up(args) => up(args),
        LabCommand::Down { dir } => down(&dir),
    }
}

fn up(args: LabUpArgs) -> Result<()> {
    let stop = Stop::on_signals()?;
    let lab = hongbao_lab::Lab::up(hongbao_lab::LabPlan {
        lab: args.lab,
        dir: std::path::absolute(&args.dir)?,
        gateways: args.gateways,
        loads: args.loads,
        nginx: !args.no_nginx,
        hongbao: std::env::current_exe()?,
        serve: hongbao_server::config::ServeFlags {
            workers: Some(args.workers),
            secret: Some(args.secret),
            ..Default::default()
        },
        monitor_key: None,
        postgres_disk: None,
        standby: args.standby,
        shards: args.shards as usize,
    })?;
    println!("hongbao lab {} up: dir={}", args.lab, args.dir.display());
    for host in lab.hosts() {
        println!("  {:<8} {:<15} netns {}", host.name, host.addr, host.netns);
    }
    println!(
        "  redis    {} (password in {})",
        lab.redis_urls(),
        args.dir.join(hongbao_lab::REDIS_PASSWORD_FILE).display()
    );
    println!(
        "  postgres {} (password in {})",
        lab.postgres_url(),
        args.dir.join(hongbao_lab::POSTGRES_PASSWORD_FILE).display()
    );
    for k in 1..lab.shard_count() {
        println!("  shard {k}  {}", lab.shard_url(k));
    }
    if lab.formation.is_some() {
        for k in 0..lab.shard_count() {
            println!(
                "  shard {k}  primary {} with a synchronous standby, failed over by pg_auto_failover",
                lab.pg_primary_of(k)?,
            );
        }
    }
    println!(
        "  TLS: the engines' CA {} (Redis and PostgreSQL speak TLS only)",
        lab.tls_dir().join("ca.pem").display()
    );
    println!(
        "  admin key (every gateway): {}",
        args.dir.join(hongbao_lab::ADMIN_KEY_FILE).display()
    );
    for gw in &lab.gateways {
        println!(
            "  gateway  {}: tcp {} ws {} http {} admin {}",
            gw.host.name,
            gw.tcp(),
            gw.ws(),
            gw.http(),
            gw.admin()
        );
    }
    if let Some((tcp, http, ws)) = lab.nginx_addrs() {
        println!("  nginx    tcp {tcp} http {http} ws {ws}");
    }
    println!("Ctrl-C takes it down.");
    while !stop.requested() {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(lab);
    println!("hongbao lab {} down", args.lab);
    Ok(())
}

fn down(dir: &Path) -> Result<()> {
    let state = hongbao_lab::down(dir)?;
    println!(
        "hongbao lab {} down: {} processes, {} hosts",
        state.lab,
        state.procs.len(),
        state.netns.len()
    );
    Ok(())
}
