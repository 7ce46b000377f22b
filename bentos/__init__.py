"""Release and deployment of the bento: build, image build context, deployment specs
(BentoCloud, Kubernetes) and a local split deployment. See docs/release.md."""
