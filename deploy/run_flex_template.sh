#!/usr/bin/env bash
# Launches a conversion from the Flex Template built by build_template.sh.
#
#   PROJECT=p REGION=us-central1 TEMPLATE=gs://b/templates/imagerecords-abc.json \
#   IMAGE=us-central1-docker.pkg.dev/p/imagerecords/imagerecords:abc \
#   deploy/run_flex_template.sh input=gs://b/images,output=gs://b/records[,image_size=224,...]
#
# Optional: SERVICE_ACCOUNT (worker identity), MAX_WORKERS (default 50),
# MACHINE_TYPE (default n2-standard-4), TEMP_LOCATION (default from the template bucket).
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${TEMPLATE:?set TEMPLATE (gs://...json)}"
: "${IMAGE:?set IMAGE (the container image the template was built with)}"
PARAMETERS="${1:?usage: $0 input=gs://...,output=gs://...[,name=value...]}"
BUCKET="${TEMPLATE#gs://}"; BUCKET="gs://${BUCKET%%/*}"
ARGS=(
  --project "$PROJECT" --region "$REGION"
  --template-file-gcs-location "$TEMPLATE"
  --parameters "$PARAMETERS,sdk_container_image=$IMAGE"
  --max-workers "${MAX_WORKERS:-50}"
  --worker-machine-type "${MACHINE_TYPE:-n2-standard-4}"
  --temp-location "${TEMP_LOCATION:-$BUCKET/tmp}"
)
if [[ -n "${SERVICE_ACCOUNT:-}" ]]; then ARGS+=(--service-account-email "$SERVICE_ACCOUNT"); fi
gcloud dataflow flex-template run "imagerecords-$(date +%Y%m%d-%H%M%S)" "${ARGS[@]}"
