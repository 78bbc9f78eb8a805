//! What authentication costs: GetUnreadCount against two fresh api
//! processes started alike, one without auth and one with auth on (a
//! bearer-token client with a call quota, so the limiter's path is paid
//! too), in alternating rounds on the same data, comparing the api's CPU per
//! call. (The main api is not the baseline: it has served every earlier
//! phase, and a fresh process on the other side would not compare alike.)

use std::fmt::Write as _;
use std::time::Duration;

use notify_domain::auth::{new_token, token_sha256_hex};

use super::{BadgeArgs, GET_UNREAD_COUNT, Load, run_wire};
use crate::harness::{Env, thousands, verdict};
use crate::procstat::Tracked;

/// Most extra api CPU per call that authentication may cost.
const TARGET: f64 = 0.05;

/// Runs both sides in `args.rounds` alternating rounds and reports.
pub async fn overhead(env: &mut Env, args: &BadgeArgs) -> anyhow::Result<String> {
    let token = new_token();
    let extra = format!(
        "[auth]\nenabled = true\n\n[[auth.clients]]\nname = \"bench\"\n\
         token_sha256 = [\"{}\"]\nscopes = [\"inbox.read\"]\nrequests_per_second = 1000000\n",
        token_sha256_hex(&token)
    );
    let (plain_addr, plain_pid) = env.start_extra_api("notify-api-plain", "").await?;
    let (auth_addr, auth_pid) = env.start_extra_api("notify-api-auth", &extra).await?;
    println!("auth overhead: apis without auth, pid {plain_pid}, and with auth, pid {auth_pid}");
    let tracked = Tracked::new(&[("api", plain_pid), ("api-auth", auth_pid)]);
    let round = Duration::from_secs(args.seconds) / args.rounds;
    let (mut plain, mut authed): (Option<Load>, Option<Load>) = (None, None);
    // Rounds alternate which side goes first (ABBA), so that whatever the
    // machine does over time falls on both sides alike.
    for index in 0..args.rounds {
        for authed_side in [index % 2 == 1, index % 2 == 0] {
            if authed_side {
                let target = (auth_addr.as_str(), Some(token.as_str()));
                let load = run_wire(args, &tracked, (1, round), target, GET_UNREAD_COUNT).await?;
                merge(&mut authed, load)?;
            } else {
                let target = (plain_addr.as_str(), None);
                let load = run_wire(args, &tracked, (1, round), target, GET_UNREAD_COUNT).await?;
                merge(&mut plain, load)?;
            }
        }
        println!("auth round {} of {} done", index + 1, args.rounds);
    }
    env.check_children()?;
    let (Some(plain), Some(authed)) = (plain, authed) else {
        anyhow::bail!("no auth rounds ran");
    };
    let plain_us = cpu_us_per_call(&plain, "api");
    let authed_us = cpu_us_per_call(&authed, "api-auth");
    let extra_cost = authed_us / plain_us - 1.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nauthentication (bearer token, scope check, call quota), GetUnreadCount, {} rounds each, 1-thread h2 load:",
        args.rounds
    );
    for (name, load, us) in [("auth off", &plain, plain_us), ("auth on", &authed, authed_us)] {
        let _ = writeln!(
            s,
            "  {name:<9} {:>9} req/s  p99 {:.3} ms  api CPU {us:.1} us/call  wrong {}",
            thousands(load.rate() as u64),
            load.ms(0.99),
            load.wrong
        );
    }
    let _ = writeln!(
        s,
        "  api CPU per call with auth: {:+.1}% (target <= +{:.0}%) {}",
        extra_cost * 100.0,
        TARGET * 100.0,
        verdict(extra_cost <= TARGET && plain.wrong + authed.wrong == 0)
    );
    Ok(s)
}

fn merge(total: &mut Option<Load>, round: Load) -> anyhow::Result<()> {
    match total {
        Some(total) => total.merge(round),
        None => {
            *total = Some(round);
            Ok(())
        }
    }
}

/// CPU µs the named process spent per call of `load`.
fn cpu_us_per_call(load: &Load, process: &str) -> f64 {
    let percent =
        load.cpu.per_process.iter().find(|(name, _)| name == process).map_or(0.0, |p| p.1);
    percent / 100.0 * load.secs * 1e6 / load.ops.max(1) as f64
}
