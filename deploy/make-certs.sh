#!/usr/bin/env bash
# Makes what a segps job needs for mutual TLS and bearer tokens, with openssl:
#   DIR/ca.pem, ca.key         a CA (keep ca.key off the job's hosts)
#   DIR/server.pem, server.key the servers' certificate, for every name given
#   DIR/client.pem, client.key a client certificate (workers, evaluator, probes)
#   DIR/tokens                 `worker TOKEN`, `reader TOKEN` and `server SECRET` (the servers'
#                              token_file; SECRET seals the states servers tell workers)
#   DIR/worker.token, reader.token   one line each (a client's token_file)
#
#   bash deploy/make-certs.sh [--container | --k8s] DIR [NAME ...]
# NAMEs are the servers' host names and IP addresses (compose service names,
# pod DNS names, hosts); localhost and 127.0.0.1 are always included. Files
# are made readable by their owner only. --container (for the compose
# file's secrets, which Docker bind-mounts with the files' own owner and
# mode) lets the containers' user read every file but ca.key, and keeps
# other host users out by the directory's mode (0700) instead. --k8s also
# writes DIR/secrets.yaml: the Secrets the Kubernetes manifests mount at
# /certs, one a role, each with only what that role's pods read:
#   segps-server-tls  ca.pem server.pem server.key tokens, and client.pem
#                     client.key reader.token for its health probe
#   segps-worker-tls  ca.pem client.pem client.key worker.token, and
#                     server.pem server.key for a chain stage's link
#   segps-reader-tls  ca.pem client.pem client.key reader.token (evaluation)
# (`kubectl apply -f DIR/secrets.yaml`; segps-k8s prints the NAMEs a job needs).
set -euo pipefail
container=0
k8s=0
case "${1:-}" in
  --container) container=1; shift ;;
  --k8s) k8s=1; shift ;;
esac
if [ $# -lt 1 ]; then
  echo "usage: $0 [--container | --k8s] DIR [NAME ...]" >&2
  exit 2
fi
dir=$1
shift
mkdir -p "$dir"
umask 077
san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san="$san,IP:$name"; else san="$san,DNS:$name"; fi
done
days=825
openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj "/CN=segps CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" 2> /dev/null
sign() {  # sign NAME SUBJECT EXTENDED_KEY_USAGE [SAN]
  local ext
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"
    [ -n "${4:-}" ] && echo "subjectAltName=$4"
  } > "$ext"
  openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$2" -keyout "$dir/$1.key" -out "$dir/$1.csr" 2> /dev/null
  openssl x509 -req -sha256 -days $days -in "$dir/$1.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -extfile "$ext" -out "$dir/$1.pem" 2> /dev/null
  rm -f "$dir/$1.csr" "$ext"
}
sign server "segps server" serverAuth,clientAuth "$san"
sign client "segps client" clientAuth
rm -f "$dir/ca.srl"
worker=$(openssl rand -hex 24)
reader=$(openssl rand -hex 24)
printf 'worker %s\nreader %s\nserver %s\n' "$worker" "$reader" "$(openssl rand -hex 24)" > "$dir/tokens"
printf 'worker %s\n' "$worker" > "$dir/worker.token"
printf 'reader %s\n' "$reader" > "$dir/reader.token"
if [ $container -eq 1 ]; then
  chmod 700 "$dir"
  chmod 644 "$dir"/*.pem "$dir"/server.key "$dir"/client.key "$dir"/tokens "$dir"/*.token
fi
secret() {  # secret NAME FILE...: a Secret with each file as a key
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  labels: {app.kubernetes.io/part-of: segps}\ntype: Opaque\ndata:\n' "$1"
  shift
  for file in "$@"; do printf '  %s: %s\n' "$file" "$(base64 -w0 < "$dir/$file")"; done
}
if [ $k8s -eq 1 ]; then
  {
    echo "# Made by deploy/make-certs.sh --k8s: kubectl apply -f secrets.yaml (it holds private keys and tokens: keep it off shared disks)."
    secret segps-server-tls ca.pem server.pem server.key tokens client.pem client.key reader.token
    secret segps-worker-tls ca.pem client.pem client.key worker.token server.pem server.key
    secret segps-reader-tls ca.pem client.pem client.key reader.token
  } > "$dir/secrets.yaml"
fi
made="ca.pem, server.pem/key ($san), client.pem/key, tokens, worker.token, reader.token"
[ $k8s -eq 1 ] && made="$made, secrets.yaml"
echo "made $dir: $made"
