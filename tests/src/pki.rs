//! A throwaway PKI for the TLS tests: a CA, and certificates it issues for
//! 127.0.0.1 and localhost (a node's server and client certificate at
//! once), written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// One CA's certificate and key, to sign certificates with.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// PEM files of one issued certificate and the CA that issued it.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("generate a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-sign the CA");
        Ca { cert, key }
    }

    /// The CA certificate (PEM).
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate for 127.0.0.1 and localhost with common name `name`,
    /// written with its key and this CA under `dir` as `<name>.pem`,
    /// `<name>.key` and `<name>-ca.pem`.
    pub fn issue(&self, name: &str, dir: &Path) -> Issued {
        let key = KeyPair::generate().expect("generate a key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign the certificate");
        let write = |file: String, text: &str| {
            let path = dir.join(file);
            std::fs::write(&path, text).expect("write a PEM file");
            path
        };
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        Issued {
            cert: write(format!("{name}.pem"), &cert_pem),
            key: write(format!("{name}.key"), &key_pem),
            ca: write(format!("{name}-ca.pem"), &self.pem()),
            cert_pem,
            key_pem,
        }
    }
}
