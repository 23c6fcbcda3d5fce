//! `samsa user`: SCRAM users of a running cluster (the equivalent of
//! `kafka-configs.sh --entity-type users --alter --add-config
//! 'SCRAM-SHA-512=[password=…]'`), over DescribeUserScramCredentials and
//! AlterUserScramCredentials on the small client in [`crate::wire`].
//!
//! The password never leaves this process: it is salted and hashed here
//! (PBKDF2, Kafka's SaltedPassword) and only the salt, the iteration count
//! and the salted password are sent, as Kafka's admin client does. The
//! client speaks plaintext only: run it against an operator's listener.

use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::{Args, Subcommand};
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, DescribeUserScramCredentialsRequest,
};
use kafka_protocol::protocol::StrBytes;
use samsa_broker::security::scram::{random_salt, salted_password, ScramMechanism};

use crate::client::BootstrapArgs;
use crate::wire::{error_name, print_table, Connection};

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user or change its password (one mechanism).
    Add(AddArgs),
    /// List users and their mechanisms (all users, or the ones named).
    List(ListArgs),
    /// Remove a user's credentials (every mechanism, or `--mechanism`).
    Delete(DeleteArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    /// The user name.
    name: String,
    /// The password (or set SAMSA_USER_PASSWORD, which keeps it out of the
    /// process list).
    #[arg(long, env = "SAMSA_USER_PASSWORD", hide_env_values = true)]
    password: String,
    /// SCRAM-SHA-512 or SCRAM-SHA-256.
    #[arg(long, default_value = "SCRAM-SHA-512")]
    mechanism: String,
    /// PBKDF2 iterations (Kafka accepts 4096–16384).
    #[arg(long, default_value_t = 8192)]
    iterations: u32,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    /// Only these users.
    names: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    /// The user name.
    name: String,
    /// Only this mechanism's credential.
    #[arg(long)]
    mechanism: Option<String>,
}

pub async fn run(command: UserCommand) -> Result<ExitCode> {
    match command {
        UserCommand::Add(args) => add(args).await,
        UserCommand::List(args) => list(args).await,
        UserCommand::Delete(args) => delete(args).await,
    }
}

fn mechanism(name: &str) -> Result<ScramMechanism> {
    ScramMechanism::from_name(name)
        .ok_or_else(|| anyhow!("unknown mechanism {name:?} (SCRAM-SHA-512 or SCRAM-SHA-256)"))
}

async fn add(args: AddArgs) -> Result<ExitCode> {
    let mechanism = mechanism(&args.mechanism)?;
    let salt = random_salt();
    let salted = salted_password(mechanism, args.password.as_bytes(), &salt, args.iterations)
        .map_err(|e| anyhow!("{e}"))?;
    let request = AlterUserScramCredentialsRequest::default().with_upsertions(vec![
        ScramCredentialUpsertion::default()
            .with_name(StrBytes::from_string(args.name.clone()))
            .with_mechanism(mechanism.type_code())
            .with_iterations(i32::try_from(args.iterations).context("iterations")?)
            .with_salt(Bytes::from(salt))
            .with_salted_password(Bytes::from(salted)),
    ]);
    alter(&args.connect, request).await?;
    println!("user {} has a {} credential", args.name, mechanism.name());
    Ok(ExitCode::SUCCESS)
}

async fn alter(connect: &BootstrapArgs, request: AlterUserScramCredentialsRequest) -> Result<()> {
    let mut conn = Connection::connect(first(&connect.bootstrap_server)).await?;
    let (response, _) = conn.send(&request, 0).await?;
    for result in &response.results {
        if result.error_code != 0 {
            bail!(
                "user {}: {}: {}",
                result.user.as_str(),
                error_name(result.error_code),
                result.error_message.as_deref().unwrap_or("")
            );
        }
    }
    Ok(())
}

fn first(bootstrap: &str) -> &str {
    bootstrap.split(',').next().unwrap_or(bootstrap).trim()
}

/// `(user, [(mechanism, iterations)])` of the users named (all: empty).
async fn describe(
    connect: &BootstrapArgs,
    names: &[String],
) -> Result<Vec<(String, Vec<(String, i32)>)>> {
    let mut conn = Connection::connect(first(&connect.bootstrap_server)).await?;
    let users = (!names.is_empty()).then(|| {
        names
            .iter()
            .map(|n| UserName::default().with_name(StrBytes::from_string(n.clone())))
            .collect()
    });
    let (response, _) = conn
        .send(
            &DescribeUserScramCredentialsRequest::default().with_users(users),
            0,
        )
        .await?;
    if response.error_code != 0 {
        bail!(
            "{}: {}",
            error_name(response.error_code),
            response.error_message.as_deref().unwrap_or("")
        );
    }
    let mut out = Vec::new();
    for result in response.results {
        if result.error_code != 0 {
            bail!(
                "user {}: {}: {}",
                result.user.as_str(),
                error_name(result.error_code),
                result.error_message.as_deref().unwrap_or("")
            );
        }
        let credentials = result
            .credential_infos
            .iter()
            .map(|c| {
                let name = ScramMechanism::from_type_code(c.mechanism).map_or_else(
                    || format!("UNKNOWN({})", c.mechanism),
                    |m| m.name().to_owned(),
                );
                (name, c.iterations)
            })
            .collect();
        out.push((result.user.to_string(), credentials));
    }
    Ok(out)
}

async fn list(args: ListArgs) -> Result<ExitCode> {
    let users = describe(&args.connect, &args.names).await?;
    let rows: Vec<Vec<String>> = users
        .into_iter()
        .flat_map(|(user, credentials)| {
            credentials.into_iter().map(move |(mechanism, iterations)| {
                vec![user.clone(), mechanism, iterations.to_string()]
            })
        })
        .collect();
    print_table(&["USER", "MECHANISM", "ITERATIONS"], &rows);
    Ok(ExitCode::SUCCESS)
}

async fn delete(args: DeleteArgs) -> Result<ExitCode> {
    let mechanisms: Vec<ScramMechanism> = match &args.mechanism {
        Some(name) => vec![mechanism(name)?],
        None => describe(&args.connect, std::slice::from_ref(&args.name))
            .await?
            .into_iter()
            .flat_map(|(_, credentials)| credentials)
            .filter_map(|(name, _)| ScramMechanism::from_name(&name))
            .collect(),
    };
    if mechanisms.is_empty() {
        bail!("user {} has no SCRAM credentials", args.name);
    }
    let deletions = mechanisms
        .iter()
        .map(|m| {
            ScramCredentialDeletion::default()
                .with_name(StrBytes::from_string(args.name.clone()))
                .with_mechanism(m.type_code())
        })
        .collect();
    alter(
        &args.connect,
        AlterUserScramCredentialsRequest::default().with_deletions(deletions),
    )
    .await?;
    let names: Vec<&str> = mechanisms.iter().map(|m| m.name()).collect();
    println!("user {}: removed {}", args.name, names.join(", "));
    Ok(ExitCode::SUCCESS)
}
