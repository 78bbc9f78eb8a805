//! A real browser for tests: Debian's `chromium`, headless, driven over
//! WebDriver by `chromedriver` (the same build, so their versions match;
//! `scripts/test` installs both when missing), with a fresh profile and
//! nothing reaching the internet. The console's and the web inbox's
//! browser tests use it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use tokio::process::{Child, Command};

use crate::eventually;

impl Drop for Browser {
    fn drop(&mut self) {
        let group = self.driver.id().and_then(|id| rustix::process::Pid::from_raw(id as i32));
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// Finds a program on the PATH or in /usr/bin and /usr/lib/chromium.
pub fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/lib/chromium")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed: the browser tests need Debian's chromium and \
                 chromium-driver (scripts/test installs them; or apt-get install chromium \
                 chromium-driver)"
            )
        })
}

/// A headless Chromium session, its chromedriver and its fresh profile.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a Chromium session with a window of
    /// `width` x `height`.
    pub async fn start(width: u32, height: u32) -> Self {
        let chromium = program("chromium");
        let chromedriver = program("chromedriver");
        let port = crate::servers::free_port();
        // Its own process group, with the Chromium it starts: dropping the
        // browser (a failed test too) kills them all, and no browser of a
        // failed test lingers to slow the rest of the suite.
        let driver = Command::new(chromedriver)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let url = format!("http://127.0.0.1:{port}");
        eventually("chromedriver to listen", Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(|_| ())
        })
        .await;
        let profile = tempfile::Builder::new().prefix("notify-chromium-").tempdir().expect("dir");
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            // Nothing reaches the internet: no name but loopback resolves,
            // no proxy from the environment is used, and Chromium's own
            // services (first run, sync, time, autofill, translation,
            // hints, reliability reports) stay off.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1"
                .to_owned(),
            "--no-proxy-server".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-default-apps".to_owned(),
            "--disable-domain-reliability".to_owned(),
            "--disable-features=Translate,OptimizationHints,MediaRouter,NetworkTimeServiceQuerying,AutofillServerCommunication".to_owned(),
            "--no-pings".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = serde_json::json!({
            "goog:chromeOptions": { "binary": chromium, "args": args },
            "unhandledPromptBehavior": "ignore",
        });
        let serde_json::Value::Object(capabilities) = capabilities else { unreachable!() };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&url)
            .await
            .expect("a chromium session");
        Self { client, driver, _profile: profile }
    }

    /// Ends the session, then chromedriver and whatever is left of its
    /// process group (on drop).
    pub async fn stop(self) {
        let _ = self.client.clone().close().await;
    }

    /// The text of the element `css` selects.
    pub async fn text(&self, css: &str) -> String {
        self.client.find(Locator::Css(css)).await.expect(css).text().await.expect("text")
    }

    /// Waits for an element, as a person waits for a page.
    pub async fn wait_for(&self, css: &str, within: Duration) -> Element {
        self.client
            .wait()
            .at_most(within)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css} never showed: {e}"))
    }

    /// Runs `script` in the page and answers what it returns.
    pub async fn run(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// Saves the page as `name` (a PNG) in the directory the environment
    /// variable `dir_variable` names, when it is set.
    pub async fn screenshot(&self, dir_variable: &str, name: &str) {
        let Some(dir) = std::env::var_os(dir_variable) else { return };
        let png = self.client.screenshot().await.expect("screenshot");
        let path = Path::new(&dir).join(name);
        std::fs::write(&path, png).expect("screenshot written");
    }
}
