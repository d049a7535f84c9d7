#!/usr/bin/env bash
# One command for a newcomer: install, build the tiny random-weight model and its archive,
# start TorchServe (token auth on, loopback only) and show translation round trips.
# The tiny model's output is meaningless text: it proves the stack, not translation quality.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh web
hymt tiny-model --out build/tiny-model
hymt archive --model-path build/tiny-model --profile cpu
# The same tiny model as a second model, Hunyuan-MT-Chimera's way: it refines candidates.
hymt archive --model-path build/tiny-model --profile cpu --name hunyuan-mt-chimera \
  --set handler.prompt_family=hunyuan-mt-chimera --set maxWorkers=1
hymt stop --workdir run >/dev/null
hymt start --workdir run --model hunyuan-mt=hunyuan-mt.mar \
  --model hunyuan-mt-chimera=hunyuan-mt-chimera.mar
echo
echo "== zh -> en (a tiny random model: expect meaningless text) =="
hymt translate --workdir run "你好，世界。今天天气很好。" --to en
echo "== en -> fr, with curl =="
KEY=$(hymt token --workdir run)
curl -sS -X POST http://127.0.0.1:8080/predictions/hunyuan-mt \
  -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d '{"text": ["Good morning.", "See you tomorrow."], "source_lang": "en", "target_lang": "fr"}'
echo
echo "== a bad request: unknown language =="
curl -sS -X POST http://127.0.0.1:8080/predictions/hunyuan-mt \
  -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d '{"text": "Hello", "target_lang": "xx"}' -w '\nHTTP %{http_code}\n'
# The web page: a small front end that holds the TorchServe key and streams translations.
# (hymt stop above ended this work folder's previous one, through run/web.pid.)
# --refine-model: /api/refine (and the page's "Refine with Chimera") use the second model.
nohup hymt web --workdir run --port 8000 --refine-model hunyuan-mt-chimera > run/web.log 2>&1 &
cat <<'TXT'

TorchServe is running (inference :8080, management :8081, metrics :8082, all on 127.0.0.1).
  web page: http://127.0.0.1:8000/   (log: run/web.log)
  token:   . .venv/bin/activate && hymt token            (management: hymt token --api management)
  logs:    run/logs/
  stop:    . .venv/bin/activate && hymt stop    (TorchServe and this web page)

The translations above are meaningless text on purpose: the demo serves a tiny model with random
weights, so its words are noise, not a prompt or data from anywhere. It proves the serving
stack; serve a downloaded Hunyuan-MT model folder for real translations (README.md).
TXT
