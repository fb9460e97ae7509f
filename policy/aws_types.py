"""The pulumi-aws 7 type tokens the policies judge, as the engine names them (`package:module/resource:Class`)."""

BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")  # BucketV2: the deprecated alias of Bucket
BUCKET_ENCRYPTION = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
BUCKET_VERSIONING = (
    "aws:s3/bucketVersioning:BucketVersioning",
    "aws:s3/bucketVersioningV2:BucketVersioningV2",
)
BUCKET_PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"

LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
LUSTRE_FILE_SYSTEM = "aws:fsx/lustreFileSystem:LustreFileSystem"
REPOSITORY = "aws:ecr/repository:Repository"
KMS_KEY = "aws:kms/key:Key"
EBS_VOLUME = "aws:ebs/volume:Volume"
EFS_FILE_SYSTEM = "aws:efs/fileSystem:FileSystem"

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SECURITY_GROUPS = ("aws:ec2/securityGroup:SecurityGroup", "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SECURITY_GROUP_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"  # the older one-resource-per-rule form

VPC = "aws:ec2/vpc:Vpc"
SUBNET = "aws:ec2/subnet:Subnet"
NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
VPC_ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
VPC_ENDPOINT_ROUTE_TABLE_ASSOCIATION = (
    "aws:ec2/vpcEndpointRouteTableAssociation:VpcEndpointRouteTableAssociation"
)

PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
DEFAULT_SECURITY_GROUP = "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup"
BATCH_COMPUTE_ENVIRONMENT = "aws:batch/computeEnvironment:ComputeEnvironment"
BATCH_JOB_DEFINITION = "aws:batch/jobDefinition:JobDefinition"
KMS_KEY_POLICY = "aws:kms/keyPolicy:KeyPolicy"
METRIC_ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
SNS_TOPIC = "aws:sns/topic:Topic"

SAGEMAKER_MODEL = "aws:sagemaker/model:Model"
SAGEMAKER_ENDPOINT_CONFIGURATION = "aws:sagemaker/endpointConfiguration:EndpointConfiguration"
SAGEMAKER_ENDPOINT = "aws:sagemaker/endpoint:Endpoint"
