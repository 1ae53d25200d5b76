#!/usr/bin/env bash
# Submits a conversion to Dataflow straight from this checkout (no container build):
# workers pip-install this package from setup.py when they start.
#
#   PROJECT=p REGION=us-central1 BUCKET=gs://b deploy/run_dataflow.sh \
#       --input gs://b/images --output gs://b/records [--image_size 224 ...]
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${BUCKET:?set BUCKET, e.g. gs://my-bucket}"
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
exec "$PYTHON" -m beam_pipeline \
  --runner DataflowRunner --project "$PROJECT" --region "$REGION" \
  --temp_location "$BUCKET/tmp" --staging_location "$BUCKET/staging" \
  --setup_file ./setup.py \
  --machine_type "${MACHINE_TYPE:-n2-standard-4}" --max_num_workers "${MAX_WORKERS:-50}" \
  ${SERVICE_ACCOUNT:+--service_account_email "$SERVICE_ACCOUNT"} \
  "$@"
