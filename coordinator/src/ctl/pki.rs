//! `coordinatorctl pki`: create the fleet CA and issue component certificates, on top of
//! `protocol::pki`. Nothing here touches the network.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use protocol::Role;
use protocol::pki::{Ca, DEFAULT_TRUST_DOMAIN, IssueOptions};

use super::common::{CommandGroup, Ctx};
use super::profile::profile_text;

/// PKI commands.
#[derive(Debug, Subcommand)]
pub enum PkiCommand {
    /// Create a new fleet CA in DIR (ca.crt, ca.key with mode 0600, trust-domain).
    Init {
        /// Directory to write the CA into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Trust domain of every identity this CA issues.
        #[arg(long, default_value = DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
        /// Overwrite an existing CA.
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Issue a certificate: writes NAME.crt and NAME.key (mode 0600) into DIR.
    Issue {
        /// CA directory made by `pki init`.
        #[arg(long)]
        ca: PathBuf,
        /// Role: node, gateway, coordinator or admin.
        #[arg(long)]
        role: Role,
        /// Name: hostname for a node, rack for a gateway, user for an admin.
        #[arg(long)]
        name: String,
        /// Directory to write into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// IP address the component is reached at (repeatable).
        #[arg(long = "ip")]
        ips: Vec<IpAddr>,
        /// DNS name the component is reached at (repeatable).
        #[arg(long = "dns")]
        dns: Vec<String>,
        /// Validity in days (1 to 36500).
        #[arg(long, default_value_t = protocol::pki::DEFAULT_LEAF_VALIDITY_DAYS,
              value_parser = clap::value_parser!(u32).range(1..=36_500))]
        days: u32,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
        /// Print JSON (the files written and the identity).
        #[arg(long)]
        json: bool,
    },
}

impl CommandGroup for PkiCommand {
    async fn run(self, _ctx: &Ctx) -> anyhow::Result<()> {
        match self {
            PkiCommand::Init {
                out,
                trust_domain,
                force,
                json,
            } => {
                let ca = Ca::init(&out, &trust_domain, force)
                    .with_context(|| format!("cannot create a CA in {}", out.display()))?;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "trust_domain": ca.trust_domain(),
                            "dir": out,
                            "ca": out.join(protocol::pki::CA_CERT_FILE),
                        })
                    );
                    return Ok(());
                }
                println!(
                    "created CA for trust domain {} in {}",
                    ca.trust_domain(),
                    out.display()
                );
                Ok(())
            }
            PkiCommand::Issue {
                ca,
                role,
                name,
                out,
                ips,
                dns,
                days,
                force,
                json,
            } => {
                if role == Role::Node {
                    protocol::identity::validate_hostname(&name).with_context(|| {
                        "a node certificate's name is the node's hostname".to_string()
                    })?;
                }
                let authority = Ca::load(&ca)
                    .with_context(|| format!("cannot load the CA in {}", ca.display()))?;
                let issued = authority
                    .issue(
                        role,
                        &name,
                        &IssueOptions {
                            ips,
                            dns,
                            validity_days: days,
                            clock_offset_secs: 0,
                        },
                    )
                    .with_context(|| format!("cannot issue a {role} certificate for {name}"))?;
                let (crt, key) = issued
                    .write(&out, force)
                    .with_context(|| format!("cannot write into {}", out.display()))?;
                if let Some((end, ca_end)) =
                    protocol::pki::outlives_ca(&issued.cert_pem, authority.cert_pem())
                {
                    eprintln!(
                        "coordinatorctl: WARNING: {} is valid until {}, after its CA (until {}): peers stop trusting it when the CA expires; renew the CA before then",
                        crt.display(),
                        protocol::transport::expiry_date(end),
                        protocol::transport::expiry_date(ca_end)
                    );
                }
                let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or(p.to_path_buf());
                let ca_crt = abs(&ca.join(protocol::pki::CA_CERT_FILE));
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "identity": issued.identity.to_string(),
                            "cert": abs(&crt),
                            "key": abs(&key),
                            "ca": ca_crt,
                        })
                    );
                    return Ok(());
                }
                println!(
                    "issued {} ({}, {})",
                    issued.identity,
                    crt.display(),
                    key.display()
                );
                if role == Role::Admin {
                    println!(
                        "\ncoordinatorctl reads its connection from ~/.config/fleetmend/coordinatorctl.toml\n(or --profile FILE); put these lines there:\n\n{}",
                        profile_text(None, &ca_crt, &abs(&crt), &abs(&key))
                    );
                }
                Ok(())
            }
        }
    }
}
