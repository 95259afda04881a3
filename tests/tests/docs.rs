//! What the docs point at exists: every test the docs cite by name (the safety rules of
//! `docs/design.md` name the tests that would fail if a rule broke) is defined where they
//! say, and every relative link in the README and `docs/` leads to a file of this
//! repository. A renamed test or a moved page fails here instead of leaving a rule backed
//! by a name that no longer runs.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// The Markdown files an operator reads: the READMEs and `docs/*.md`.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    for dir in ["node-agent", "bmc-gateway"] {
        pages.push(root.join(dir).join("README.md"));
    }
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The contents of every `code span` in a Markdown text.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A test cited by name: `file.rs::[module::]test` (a file of `tests/tests/`) or a unit
/// test's module path, `module::…::tests[::test]`.
#[derive(Debug, PartialEq)]
enum Cited {
    EndToEnd {
        file: String,
        test: String,
    },
    Unit {
        module: Vec<String>,
        test: Option<String>,
    },
}

fn cited(span: &str) -> Option<Cited> {
    let parts: Vec<&str> = span.split("::").collect();
    if parts.len() < 2 {
        return None;
    }
    if let Some(stem) = parts[0].strip_suffix(".rs") {
        if !is_ident(stem) || !parts[1..].iter().all(|p| is_ident(p)) {
            return None;
        }
        return Some(Cited::EndToEnd {
            file: parts[0].to_string(),
            test: parts[parts.len() - 1].to_string(),
        });
    }
    if !parts.iter().all(|p| is_ident(p)) {
        return None;
    }
    let at = parts.iter().position(|p| *p == "tests")?;
    // `tests` last: the module's tests as a whole; one more: a test; more: not a test path.
    if at == 0 || parts.len() > at + 2 {
        return None;
    }
    Some(Cited::Unit {
        module: parts[..at].iter().map(|p| p.to_string()).collect(),
        test: parts.get(at + 1).map(|t| t.to_string()),
    })
}

fn defines(text: &str, test: &str) -> bool {
    text.match_indices(&format!("fn {test}")).any(|(i, m)| {
        text[i + m.len()..]
            .chars()
            .next()
            .is_some_and(|c| c == '(' || c == '<')
    })
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files of the module `module` in any crate of the workspace: `src/a/b.rs` (and what
/// is under `src/a/b/`), `src/a/b/mod.rs`, or, for an inline module, the file of the
/// longest prefix that is a file.
fn module_files(module: &[String]) -> Vec<PathBuf> {
    let root = root();
    let mut found = Vec::new();
    for krate in [
        "coordinator",
        "node-agent",
        "bmc-gateway",
        "protocol",
        "tests",
    ] {
        let src = root.join(krate).join("src");
        for n in (1..=module.len()).rev() {
            let dir = module[..n].iter().fold(src.clone(), |p, m| p.join(m));
            let file = dir.with_extension("rs");
            let mut files = Vec::new();
            if file.is_file() {
                files.push(file);
            }
            rust_files(&dir, &mut files);
            if !files.is_empty() {
                found.extend(files);
                break;
            }
        }
    }
    found
}

fn check_cited(c: &Cited) -> Result<(), String> {
    match c {
        Cited::EndToEnd { file, test } => {
            let p = root().join("tests/tests").join(file);
            if !p.is_file() {
                return Err(format!("{file}: no such file in tests/tests/"));
            }
            if !defines(&read(&p), test) {
                return Err(format!("tests/tests/{file} defines no test {test}"));
            }
        }
        Cited::Unit { module, test } => {
            let files = module_files(module);
            let name = module.join("::");
            if files.is_empty() {
                return Err(format!("no module {name} in any crate's src/"));
            }
            let texts: Vec<String> = files.iter().map(|f| read(f)).collect();
            let ok = match test {
                Some(t) => texts.iter().any(|x| defines(x, t)),
                None => texts.iter().any(|x| x.contains("mod tests")),
            };
            if !ok {
                return Err(format!(
                    "module {name} has no {}",
                    test.as_deref()
                        .map_or("tests".to_string(), |t| format!("test {t}"))
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn every_test_the_docs_cite_exists() {
    let mut problems = Vec::new();
    let mut checked = 0;
    let mut in_design = 0;
    for page in pages() {
        let text = read(&page);
        for span in code_spans(&text) {
            let Some(c) = cited(span) else { continue };
            checked += 1;
            if page.ends_with("docs/design.md") {
                in_design += 1;
            }
            if let Err(e) = check_cited(&c) {
                problems.push(format!("{}: `{span}`: {e}", page.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The safety rules cite dozens; finding none would mean the parsing went wrong.
    assert!(
        in_design >= 30,
        "only {in_design} tests cited in docs/design.md"
    );
    eprintln!("{checked} cited tests found");
}

/// Every `](target)` of a Markdown text that is not a URL or an anchor, without its
/// `#fragment`.
fn relative_links(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find(')')?];
            let target = target.split('#').next().unwrap_or("");
            let external = target.contains("://") || target.starts_with("mailto:");
            (!target.is_empty() && !external).then_some(target)
        })
        .collect()
}

#[test]
fn every_relative_link_in_the_docs_leads_somewhere() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let dir = page.parent().expect("a page sits in a directory");
        for target in relative_links(&read(&page)) {
            checked += 1;
            if !dir.join(target).exists() {
                problems.push(format!("{}: ({target}) does not exist", page.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 10, "only {checked} relative links found");
}

#[test]
fn citations_are_parsed_as_written() {
    assert_eq!(
        cited("fencing.rs::a_dead_machine_is_fenced"),
        Some(Cited::EndToEnd {
            file: "fencing.rs".into(),
            test: "a_dead_machine_is_fenced".into()
        })
    );
    assert_eq!(
        cited("kubernetes.rs::e2e::api_server_down"),
        Some(Cited::EndToEnd {
            file: "kubernetes.rs".into(),
            test: "api_server_down".into()
        })
    );
    assert_eq!(
        cited("fence::runner::tests::a_fence_runs"),
        Some(Cited::Unit {
            module: vec!["fence".into(), "runner".into()],
            test: Some("a_fence_runs".into())
        })
    );
    assert_eq!(
        cited("dedup::tests"),
        Some(Cited::Unit {
            module: vec!["dedup".into()],
            test: None
        })
    );
    // Not test names: paths of items, macros, config keys.
    assert_eq!(cited("protocol::env_var!"), None);
    assert_eq!(cited("fence::proof"), None);
    assert_eq!(cited("tests::x"), None);
    assert!(defines("fn a_b() {}", "a_b"));
    assert!(!defines("fn a_bc() {}", "a_b"));
    assert_eq!(
        relative_links("[a](docs/x.md#y) [b](https://e.org) [c](#z)"),
        ["docs/x.md"]
    );
}

/// The lines of the ```sh blocks of a Markdown text, continuation lines joined.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = line.trim() == "```sh";
            continue;
        }
        if !inside {
            continue;
        }
        let line = line.split(" #").next().unwrap_or(line).trim_end();
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                out.push(std::mem::take(&mut pending));
            }
        }
    }
    out
}

/// The word after `flag` in a shell line.
fn arg_of<'a>(line: &'a str, flag: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == flag)?;
    words.next()
}

/// The PKI walk-throughs agree with each other and with themselves: the CA is made on a
/// machine off the fleet in every page (README and install.md once disagreed, the README
/// making it in /etc/fleetmend on the coordinator host), and each certificate copied to a
/// host is copied from a directory a `pki init` / `pki issue --out` of the same page wrote
/// (install.md's step 4 once copied from a directory step 2 never wrote).
#[test]
fn the_pki_walkthroughs_keep_the_ca_off_the_fleet_and_copy_what_they_issued() {
    for page in [root().join("README.md"), root().join("docs/install.md")] {
        let lines = shell_lines(&read(&page));
        let name = page.display().to_string();
        let mut written: Vec<String> = Vec::new();
        let mut copied = 0;
        for line in &lines {
            if line.contains("coordinatorctl pki init") || line.contains("coordinatorctl pki issue")
            {
                let out =
                    arg_of(line, "--out").unwrap_or_else(|| panic!("{name}: no --out in {line:?}"));
                assert!(
                    !out.starts_with("/etc/") && !out.starts_with("/var/"),
                    "{name}: `{line}` writes into a fleet host's directories; the CA and the certificates are made off the fleet"
                );
                written.push(out.trim_matches('"').to_string());
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            // `install [-m MODE] [-g GROUP] SOURCE… DEST` copies too (not `install -d`).
            let sources: Vec<&str> = match words.first() {
                Some(&"scp") => words[1..].to_vec(),
                Some(&"install") if !words.contains(&"-d") => {
                    let mut v = Vec::new();
                    let mut skip = false;
                    for w in &words[1..words.len() - 1] {
                        if skip {
                            skip = false;
                        } else if ["-m", "-g", "-o"].contains(w) {
                            skip = true;
                        } else {
                            v.push(*w);
                        }
                    }
                    v
                }
                _ => Vec::new(),
            };
            for source in sources {
                let source = source.trim_matches('"');
                // Certificates, keys and the CA: what `pki` wrote.
                let pem = source.ends_with(".crt") || source.ends_with(".key");
                if source.starts_with('-') || source.contains(':') || !pem {
                    continue;
                }
                if !source.contains('/') {
                    panic!(
                        "{name}: `{line}` copies {source} from wherever the shell is: say where it was written ({written:?})"
                    );
                }
                copied += 1;
                assert!(
                    written.iter().any(|w| source.starts_with(w.as_str())),
                    "{name}: `{line}` copies {source}, which no pki init/issue --out before it wrote (those wrote {written:?})"
                );
            }
        }
        assert!(
            !written.is_empty() && copied > 0,
            "{name}: no PKI walk-through found"
        );
    }
}
