#!/usr/bin/env bash
# Builds the container (Cloud Build) and writes the Flex Template spec to GCS.
#
#   PROJECT=my-project REGION=us-central1 BUCKET=gs://my-bucket deploy/build_template.sh
#
# Needs: gcloud, an Artifact Registry Docker repository ($REPO, created once with
#   gcloud artifacts repositories create imagerecords --repository-format=docker --location=$REGION)
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${BUCKET:?set BUCKET, e.g. gs://my-bucket}"
REPO="${REPO:-imagerecords}"
cd "$(dirname "$0")/.."
TAG="${TAG:-$(git rev-parse --short HEAD 2>/dev/null || date +%Y%m%d%H%M%S)}"
IMAGE="${IMAGE:-$REGION-docker.pkg.dev/$PROJECT/$REPO/imagerecords:$TAG}"
TEMPLATE="${TEMPLATE:-$BUCKET/templates/imagerecords-$TAG.json}"

gcloud builds submit . --project "$PROJECT" --region "$REGION" \
  --config deploy/cloudbuild.yaml --substitutions "_IMAGE=$IMAGE"

gcloud dataflow flex-template build "$TEMPLATE" --project "$PROJECT" \
  --image "$IMAGE" --sdk-language PYTHON --metadata-file deploy/metadata.json

echo "image:    $IMAGE"
echo "template: $TEMPLATE"
