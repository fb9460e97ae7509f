"""The ground floor's reach into AWS, shared by every floor above it (preflight, health, models, jobs).

clients  boto3 clients with the project's retry settings, and console links to a job, a log group, a stream
imds     this EC2 instance's metadata (IMDSv2): its id and region, for the health report and quarantine
outputs  a stack's outputs: from `pulumi stack output --json`, or from a file (CI pipelines, tests)
"""
