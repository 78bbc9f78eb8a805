//! A throwaway certificate authority for TLS tests: a CA, server
//! certificates for `localhost`/`127.0.0.1`, client certificates with a
//! chosen name, and expired ones, written as PEM files in a temporary
//! directory that is removed with the value.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// PEM files of one certificate: chain and key.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A test CA with its directory of PEM files.
pub struct TestPki {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM file), what clients and servers trust.
    pub ca: PathBuf,
}

impl TestPki {
    /// Creates a CA named `name` in a fresh temporary directory.
    pub fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("notify-pki-{name}-"))
            .tempdir()
            .expect("pki directory");
        let key = KeyPair::generate().expect("ca key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.distinguished_name.push(DnType::CommonName, format!("{name} test ca"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("ca certificate");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, cert.pem()).expect("ca written");
        let issuer = Issuer::new(params, key);
        Self { dir, issuer, ca }
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Issues a server certificate for `localhost` and `127.0.0.1` as
    /// `<file>.pem` / `<file>.key`.
    pub fn server(&self, file: &str) -> CertFiles {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.subject_alt_names.push(SanType::IpAddress([127, 0, 0, 1].into()));
        params.distinguished_name.push(DnType::CommonName, "localhost");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(file, params)
    }

    /// Issues a client certificate whose DNS SAN and CN are `name`.
    pub fn client(&self, file: &str, name: &str) -> CertFiles {
        let params = client_params(name);
        self.issue(file, params)
    }

    /// Issues a client certificate for `name` that expired yesterday.
    pub fn expired_client(&self, file: &str, name: &str) -> CertFiles {
        let mut params = client_params(name);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(30);
        params.not_after = now - time::Duration::days(1);
        self.issue(file, params)
    }

    fn issue(&self, file: &str, params: CertificateParams) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        let files = CertFiles {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).expect("certificate written");
        std::fs::write(&files.key, key.serialize_pem()).expect("key written");
        files
    }
}

fn client_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(vec![name.to_owned()]).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}
